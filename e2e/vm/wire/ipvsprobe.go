package wire

// The ipvsprobe protocol (e2e/vm/cmd/ipvsprobe, host side vm.Probe): the
// guest program connects to a host port through guestfwd and then answers
// ProbeRequests, one JSON line each, with ProbeEvents, one JSON line each;
// the last event of a request has Final set. The host timestamps events
// as they arrive, so no guest clock is involved in a measurement.

// ProbeOp names what a ProbeRequest asks for.
type ProbeOp string

const (
	// ProbeCount counts the virtual servers matching Filter in each of
	// Netns and their real servers.
	ProbeCount ProbeOp = "count"
	// ProbeAwaitCount polls each of Netns every IntervalMS, but waiting at
	// least 4 times as long as the last poll took (real servers are one
	// netlink request per virtual server), until it holds at least VS
	// virtual servers and RS real servers matching Filter; one "reached"
	// event per namespace as it gets there.
	ProbeAwaitCount ProbeOp = "await_count"
	// ProbeAwaitRS polls each of Netns every IntervalMS until every
	// Target's real server is in its virtual server with a weight above
	// zero, and each of NFTNetns until, in kube-proxy's nftables table
	// ("kube-proxy", IPv4), every NFTTarget's endpoint (RS) is in the dnat
	// map of its service-port chain (VS: the chain's name); a "polling"
	// event once the first poll ran, then one "seen" event per namespace.
	ProbeAwaitRS ProbeOp = "await_rs"
	// ProbeNFTCount counts, in each of Netns, kube-proxy's nftables
	// service-port chains ("service-...") whose name contains one of
	// Match[0] (none: all) as VS, and the endpoints in their dnat maps as
	// RS; one "count" event per namespace.
	ProbeNFTCount ProbeOp = "nft_count"
	// ProbeDiff compares the virtual and real servers matching Filter of
	// Netns[0] and Netns[1] (address, port, protocol, scheduler, flags,
	// persistence; real server address, port, weight).
	ProbeDiff ProbeOp = "diff"
	// ProbeProcs reports the processes whose command line contains every
	// string of one of Match (VmHWM, VmRSS, CPU ticks).
	ProbeProcs ProbeOp = "procs"
	// ProbeForks reports /proc/stat's "processes" (forks and threads
	// created since boot, VM-wide).
	ProbeForks ProbeOp = "forks"
	// ProbeMetrics fetches http://URL inside Netns[0] (a socket opened in
	// that namespace) and returns the lines starting with one of Match[0].
	ProbeMetrics ProbeOp = "metrics"
)

// ProbeFilter selects virtual servers: inside CIDR (empty: any) and on one
// of Ports (empty: any).
type ProbeFilter struct {
	CIDR  string   `json:"cidr,omitempty"`
	Ports []uint16 `json:"ports,omitempty"`
}

// ProbeTarget is one virtual server (TCP "ip:port") and the real server
// ("ip:port") ProbeAwaitRS waits for in it.
type ProbeTarget struct {
	VS string `json:"vs"`
	RS string `json:"rs"`
}

// ProbeRequest is one request from the host.
type ProbeRequest struct {
	ID         int           `json:"id"`
	Op         ProbeOp       `json:"op"`
	Netns      []string      `json:"netns,omitempty"`
	Filter     ProbeFilter   `json:"filter"`
	VS         int           `json:"vs,omitempty"`
	RS         int           `json:"rs,omitempty"`
	Targets    []ProbeTarget `json:"targets,omitempty"`
	NFTNetns   []string      `json:"nft_netns,omitempty"`
	NFTTargets []ProbeTarget `json:"nft_targets,omitempty"`
	IntervalMS int           `json:"interval_ms,omitempty"`
	TimeoutMS  int           `json:"timeout_ms,omitempty"`
	Match      [][]string    `json:"match,omitempty"`
	URL        string        `json:"url,omitempty"`
}

// ProbeEvent is one answer line from the guest.
type ProbeEvent struct {
	ID    int    `json:"id"`
	Kind  string `json:"kind"` // count, reached, polling, seen, diff, procs, forks, metrics, done, error
	Netns string `json:"netns,omitempty"`
	Final bool   `json:"final,omitempty"`
	Error string `json:"error,omitempty"`
	// VS and RS are counts (count, reached, diff: of Netns[0]); Polls the
	// polls made so far.
	VS    int `json:"vs,omitempty"`
	RS    int `json:"rs,omitempty"`
	Polls int `json:"polls,omitempty"`
	// GuestUS (polling, seen) is when the poll that gave the event ran,
	// in microseconds on the probe's monotonic clock: the host subtracts
	// two of them to time a change without the guest-to-host delay.
	GuestUS int64 `json:"guest_us,omitempty"`
	// Diff: RS2/VS2 are Netns[1]'s counts; OnlyA/OnlyB up to 20 lines each
	// that only one side has; Same when there are none.
	VS2   int      `json:"vs2,omitempty"`
	RS2   int      `json:"rs2,omitempty"`
	Same  bool     `json:"same,omitempty"`
	OnlyA []string `json:"only_a,omitempty"`
	OnlyB []string `json:"only_b,omitempty"`
	// Procs, Forks and Text answer procs, forks and metrics.
	Procs []ProcStat `json:"procs,omitempty"`
	Forks uint64     `json:"forks,omitempty"`
	Text  string     `json:"text,omitempty"`
}

// ProcStat is one guest process's memory and CPU from /proc/PID/status
// and /proc/PID/stat. CPU times are in clock ticks (ClockTicks per second);
// C* are its waited-for children's (iptables, ipset... it ran).
type ProcStat struct {
	PID        int    `json:"pid"`
	Cmdline    string `json:"cmdline"`
	VmHWMKB    int64  `json:"vm_hwm_kb"`
	VmRSSKB    int64  `json:"vm_rss_kb"`
	RssAnonKB  int64  `json:"rss_anon_kb"`
	RssFileKB  int64  `json:"rss_file_kb"`
	RssShmemKB int64  `json:"rss_shmem_kb"`
	Threads    int    `json:"threads"`
	UTime      uint64 `json:"utime"`
	STime      uint64 `json:"stime"`
	CUTime     uint64 `json:"cutime"`
	CSTime     uint64 `json:"cstime"`
	ClockTicks int    `json:"clock_ticks"`
}

// CPUSeconds is utime+stime; ChildCPUSeconds cutime+cstime.
func (p ProcStat) CPUSeconds() float64 {
	return float64(p.UTime+p.STime) / float64(max(p.ClockTicks, 1))
}

// ChildCPUSeconds is the CPU of the process's waited-for children.
func (p ProcStat) ChildCPUSeconds() float64 {
	return float64(p.CUTime+p.CSTime) / float64(max(p.ClockTicks, 1))
}
