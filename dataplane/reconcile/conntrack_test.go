package reconcile

import (
	"errors"
	"strings"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// The conntrack settings reach the kernel as kube-proxy's setupConntrack
// writes them, only where they differ; a refused write fails node/settings
// with the kernel's message and the other settings still apply.
func TestConntrackSettings(t *testing.T) {
	sysctl := func(t *testing.T, mk *memory.Kernel, name string) int {
		t.Helper()
		v, err := mk.Kernel().Sysctl.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	ns := defaultNodeSettings()
	ns.Conntrack = &vsplanev1.ConntrackSettings{MaxPerCore: 32768, Min: 131072, TcpEstablishedTimeoutSeconds: 86400,
		TcpCloseWaitTimeoutSeconds: 3600, TcpBeLiberal: true, UdpTimeoutSeconds: 45, UdpStreamTimeoutSeconds: 0}

	t.Run("applied where different", func(t *testing.T) {
		mk := memory.New()
		r := newReconciler(t, mk, Config{NumCPU: 2})
		mustAck(t, apply(t, r, full(settingsRes(ns), svcA.resource())))
		for name, want := range map[string]int{
			// 2 CPUs x 32768 is below min: min wins.
			kernel.SysctlConntrackMax: 131072, kernel.SysctlConntrackTCPTimeoutEstablished: 86400,
			kernel.SysctlConntrackTCPTimeoutCloseWait: 3600, kernel.SysctlConntrackTCPBeLiberal: 1,
			kernel.SysctlConntrackUDPTimeout:       45,
			kernel.SysctlConntrackUDPTimeoutStream: 120, // 0: left alone
		} {
			if got := sysctl(t, mk, name); got != want {
				t.Errorf("%s = %d, want %d", name, got, want)
			}
		}
		if h, _ := mk.Kernel().Sysctl.ConntrackHashsize(); h != 131072/4 {
			t.Errorf("hashsize %d, want a quarter of nf_conntrack_max (%d)", h, 131072/4)
		}
		// tcp_be_liberal: the INVALID drop is left out, as with kube-proxy's
		// rules on such a node.
		b, err := mk.Kernel().IPTables.Save(t.Context(), kernel.FamilyIPv4, kernel.TableFilter)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "INVALID") {
			t.Errorf("KUBE-FORWARD still drops INVALID with tcp_be_liberal set:\n%s", b)
		}
		// Nothing differs any more: a restarted agent writes no sysctl.
		mk.ResetCalls()
		mustAck(t, apply(t, newReconciler(t, mk, Config{NumCPU: 2}), full(settingsRes(ns), svcA.resource())))
		for op, n := range writes(mk) {
			if strings.Contains(op, "sysctl") {
				t.Errorf("restart wrote %s %d times", op, n)
			}
		}
	})

	t.Run("more CPUs scale the table; a larger hashsize stays", func(t *testing.T) {
		mk := memory.New()
		if err := mk.Kernel().Sysctl.SetConntrackHashsize(1 << 20); err != nil {
			t.Fatal(err)
		}
		mustAck(t, apply(t, newReconciler(t, mk, Config{NumCPU: 16}), full(settingsRes(ns))))
		if got := sysctl(t, mk, kernel.SysctlConntrackMax); got != 16*32768 {
			t.Errorf("nf_conntrack_max %d, want 16 x 32768", got)
		}
		if h, _ := mk.Kernel().Sysctl.ConntrackHashsize(); h != 1<<20 {
			t.Errorf("hashsize %d, want 1<<20 kept (never lowered)", h)
		}
	})

	t.Run("refused hashsize is NACKed, the rest applies", func(t *testing.T) {
		mk := memory.New()
		mk.SetConntrackHashsizeError(errors.New("operation not supported"))
		ack := apply(t, newReconciler(t, mk, Config{NumCPU: 2}), full(settingsRes(ns), svcA.resource()))
		var msgs []string
		for _, e := range ack.GetErrors() {
			msgs = append(msgs, e.GetName()+": "+e.GetMessage())
		}
		if len(msgs) != 1 || !strings.Contains(msgs[0], SettingsResource) || !strings.Contains(msgs[0], "conntrack hashsize=32768: operation not supported") {
			t.Errorf("NACKs %q, want node/settings with the hashsize error", msgs)
		}
		if got := sysctl(t, mk, kernel.SysctlConntrackUDPTimeout); got != 45 {
			t.Errorf("udp timeout %d: the other settings must still apply", got)
		}
	})

	t.Run("out of range", func(t *testing.T) {
		mk := memory.New()
		bad := defaultNodeSettings()
		bad.Conntrack = &vsplanev1.ConntrackSettings{UdpTimeoutSeconds: 1 << 31, TcpCloseWaitTimeoutSeconds: 30}
		ack := apply(t, newReconciler(t, mk, Config{}), full(settingsRes(bad)))
		if len(ack.GetErrors()) != 1 || !strings.Contains(ack.GetErrors()[0].GetMessage(), "conntrack.udp_timeout_seconds") {
			t.Errorf("errors %v, want conntrack.udp_timeout_seconds named", ack.GetErrors())
		}
		if sysctl(t, mk, kernel.SysctlConntrackUDPTimeout) != 30 || sysctl(t, mk, kernel.SysctlConntrackTCPTimeoutCloseWait) != 30 {
			t.Errorf("udp timeout must stay 30 (left unchanged), close-wait must be set to 30")
		}
	})
}
