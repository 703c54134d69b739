package reconcile

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Fuzz targets: wire bytes as the control plane could send them. Run one
// at a time: go test -run '^$' -fuzz '^FuzzCompile$' ./dataplane/reconcile

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func seedResources() []*vsplanev1.Resource {
	return []*vsplanev1.Resource{goodService(), goodSettings(), hostileService(), svcA.resource(),
		nodePortRes("np", 30080, 30081, "198.19.1.9"), lbWithSourceRanges(true), settingsRes(defaultNodeSettings())}
}

// plainControl reports a control character in a message (wire strings
// must appear quoted).
func plainControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// checkDesiredVS checks what compileVS promises of an accepted virtual
// server (explicit: a real address; else a NodePort template).
func checkDesiredVS(t *testing.T, c *compiler, d desiredVS, explicit bool) {
	t.Helper()
	k := d.vs.Key
	if explicit {
		a, err := parseServiceAddr(k.Address.String())
		if err != nil || a != k.Address {
			t.Fatalf("accepted virtual server address %q: %v", k.Address, err)
		}
	} else if k.Address.IsValid() {
		t.Fatalf("template with address %v", k.Address)
	}
	if !c.families.has(k.Family) || k.Port == 0 || !k.Protocol.Valid() || k.FWMark != 0 {
		t.Fatalf("accepted key %+v", k)
	}
	if s := d.vs.Scheduler; s != "" && !slices.Contains(c.schedulers, s) {
		t.Fatalf("accepted scheduler %q", s)
	}
	if p := d.vs.Flags&kernel.FlagPersistent != 0; (p && (d.vs.Timeout < 1 || d.vs.Timeout > maxPersistenceTimeout)) || (!p && d.vs.Timeout != 0) {
		t.Fatalf("persistence flags %#x timeout %d", d.vs.Flags, d.vs.Timeout)
	}
	if explicit {
		if err := d.kernelVS("rr").Validate(); err != nil {
			t.Fatalf("accepted virtual server fails kernel validation: %v", err)
		}
	}
	switch d.binding {
	case vsplanev1.AddressBinding_ADDRESS_BINDING_NONE, vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS, vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL:
	default:
		t.Fatalf("binding %v", d.binding)
	}
	if !explicit && d.binding != vsplanev1.AddressBinding_ADDRESS_BINDING_NONE {
		t.Fatalf("NodePort template bound %v", d.binding)
	}
	if d.reject && len(d.dests) > 0 {
		t.Fatal("reject with real servers")
	}
	for i, dd := range d.dests {
		dst := dd.kernel()
		if newDesiredDest(dst) != dd {
			t.Fatalf("real server %+v does not round-trip: %+v", dd, dst)
		}
		a, err := parseServiceAddr(dst.Address.String())
		if err != nil || a != dst.Address || kernel.FamilyOf(a) != k.Family || dst.Port == 0 || dst.Weight > maxWeight || dst.Validate(k.Family) != nil {
			t.Fatalf("accepted real server %+v of %v: %v", dst, k, err)
		}
		if i > 0 && d.dests[i-1].Key().Compare(dst.Key()) >= 0 {
			t.Fatal("real servers not sorted and unique")
		}
	}
}

// checkCompiled checks a compiled resource against everything validation
// promises.
func checkCompiled(t *testing.T, c *compiler, rs *resourceState) {
	t.Helper()
	for _, p := range rs.problems {
		if plainControl(p) {
			t.Fatalf("problem with a raw control character: %q", p)
		}
	}
	vss, entries := rs.vss, rs.entries
	if rs.tmpl != nil {
		vss, entries = rs.tmpl.base.vss, rs.tmpl.base.entries
		for _, d := range rs.tmpl.vss {
			checkDesiredVS(t, c, d, false)
		}
		for _, ek := range rs.tmpl.entries {
			if ek.entry.Port == 0 || !ek.entry.Protocol.Valid() || ek.entry.IP.IsValid() || !c.families.has(ek.set.family) {
				t.Fatalf("entry template %v", ek)
			}
		}
	}
	for i, d := range vss {
		if i > 0 && vss[i-1].vs.Key.Compare(d.vs.Key) >= 0 {
			t.Fatalf("virtual servers not sorted and unique: %v before %v", vss[i-1].vs.Key, d.vs.Key)
		}
		checkDesiredVS(t, c, d, true)
	}
	for _, ek := range entries {
		if err := ek.entry.Validate(ek.set.spec()); err != nil || !c.families.has(ek.set.family) || ek.set.set == rules.SetIPVSIPs {
			t.Fatalf("accepted entry %v: %v", ek, err)
		}
		if ek.entry.Port == 0 && ek.set.set.Type() != kernel.HashIP && ek.set.set.Type() != kernel.HashNet {
			t.Fatalf("accepted entry %v with port 0", ek)
		}
	}
	if h := rs.health; h != nil {
		ns, name, ok := serviceName(rs.name)
		if !ok || h.Port == 0 || h.Namespace != ns || h.Name != name {
			t.Fatalf("health check %+v of %q", h, rs.name)
		}
	}
	if s := rs.settings; s != nil {
		if !slices.Contains(c.schedulers, s.defaultScheduler) || s.masqueradeBit > 31 || s.reconcilePeriod > maxReconcilePeriod {
			t.Fatalf("settings %+v", s)
		}
		for _, d := range []int64{int64(s.timeouts.TCP), int64(s.timeouts.TCPFin), int64(s.timeouts.UDP)} {
			if d < 0 || d > int64(secs(maxIPVSTimeout)) {
				t.Fatalf("timeouts %+v", s.timeouts)
			}
		}
		for _, p := range slices.Concat(s.clusterCIDRs, s.excludeCIDRs, s.nodePortCIDRs) {
			if !p.IsValid() || p != p.Masked() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
				t.Fatalf("settings CIDR %v", p)
			}
		}
	}
}

// FuzzCompile: any Resource either fails its identity check or compiles;
// every virtual server, real server, entry and setting it keeps passes
// the validation of validate.go, and messages carry no raw control
// characters.
func FuzzCompile(f *testing.F) {
	for _, res := range seedResources() {
		f.Add(mustMarshal(res))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var res vsplanev1.Resource
		if proto.Unmarshal(b, &res) != nil {
			return
		}
		if err := checkIdentity(&res); err != nil {
			if plainControl(err.Error()) {
				t.Fatalf("identity message with a raw control character: %q", err)
			}
			return
		}
		rs := testCompiler.compile(&res)
		checkCompiled(t, testCompiler, rs)
		marks := newInClusterMarks(rules.DefaultMasqueradeBit)
		ex := rs.expand(nodePortAddrs{kernel.FamilyIPv4: {netip.MustParseAddr("198.19.0.11")}, kernel.FamilyIPv6: {netip.MustParseAddr("2001:2:0:100::11")}}, marks)
		for i, d := range ex.vss {
			key := d.vs.Key
			if i > 0 && ex.vss[i-1].vs.Key.Compare(key) >= 0 {
				t.Fatalf("expanded virtual servers not sorted and unique: %v before %v", ex.vss[i-1].vs.Key, key)
			}
			switch {
			case key.FWMark != 0 && (!marks.isOurs(key.FWMark) || key.Validate() != nil):
				t.Fatalf("in-cluster fwmark key %v", key)
			case key.FWMark == 0 && (kernel.CheckAddr(key.Address) != nil || key.Validate() != nil):
				t.Fatalf("expanded key %v", key)
			}
		}
	})
}

var fuzzFamilies = []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6}

// FuzzApply: a Delta from arbitrary bytes, applied over a node holding
// two Services. Every resource it names either applies or is NACKed with
// a message; what the kernel then holds passes validation (no zone, no
// special address, an offered scheduler, valid entries) and the built-in
// iptables chains hold only our jumps.
func FuzzApply(f *testing.F) {
	res := seedResources()
	f.Add(mustMarshal(&vsplanev1.Delta{Nonce: "1", Resources: res[:2]}))
	f.Add(mustMarshal(&vsplanev1.Delta{Nonce: "2", Resources: res, ReplaceAll: true}))
	f.Add(mustMarshal(&vsplanev1.Delta{Nonce: "3", Resources: res[2:4], Removed: []string{"service/default/b"}}))
	f.Add(mustMarshal(&vsplanev1.Delta{Nonce: "4", Resources: res[4:]}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var delta vsplanev1.Delta
		if proto.Unmarshal(b, &delta) != nil || len(delta.GetResources()) > 32 {
			return
		}
		mk := memory.New()
		nodeInterfaces(mk)
		r, err := New(mk.Kernel(), Config{Families: fuzzFamilies}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if ack := r.Apply(ctx, full(settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource())); len(ack.GetErrors()) > 0 {
			t.Fatalf("baseline: %v", ack.GetErrors())
		}
		before := r.Versions()
		ack := r.Apply(ctx, &delta)
		if ack.GetNonce() != delta.GetNonce() || (ack.GetStatus() == vsplanev1.AckStatus_ACK_STATUS_NACK) != (len(ack.GetErrors()) > 0) {
			t.Fatalf("ack %v", ack)
		}
		errs := map[string]string{}
		for _, e := range ack.GetErrors() {
			if e.GetMessage() == "" || plainControl(e.GetMessage()) {
				t.Fatalf("error message %q", e.GetMessage())
			}
			errs[e.GetName()] += e.GetMessage()
		}
		last := map[string]*vsplanev1.Resource{}
		times := map[string]int{}
		for _, res := range delta.GetResources() {
			last[res.GetName()] = res
			times[res.GetName()]++
		}
		versions := r.Versions()
		for name, res := range last {
			if slices.Contains(delta.GetRemoved(), name) {
				continue
			}
			v, applied := versions[name]
			switch {
			case times[name] > 1:
				// Named twice: refused, what was applied before stays.
				if errs[name] == "" || v != before[name] {
					t.Fatalf("%q named %d times: applied %q (before %q), error %q", name, times[name], v, before[name], errs[name])
				}
			case checkIdentity(res) != nil && ((applied && v == res.GetVersion()) || errs[name] == ""):
				// Refused whole: what was applied before stays.
				t.Fatalf("bad identity %q: applied %v, error %q", name, applied, errs[name])
			case checkIdentity(res) != nil:
			case applied && (v != res.GetVersion() || errs[name] != ""):
				t.Fatalf("%q applied as %q (sent %q) with error %q", name, v, res.GetVersion(), errs[name])
			case !applied && errs[name] == "":
				t.Fatalf("%q neither applied nor NACKed", name)
			}
		}
		checkKernel(t, mk)
	})
}

// checkKernel checks what the memory kernel holds.
func checkKernel(t *testing.T, mk *memory.Kernel) {
	t.Helper()
	k := mk.Kernel()
	vss, _ := k.IPVS.ListVirtualServers()
	for _, vs := range vss {
		if a, err := parseServiceAddr(vs.Key.Address.String()); err != nil || a != vs.Key.Address {
			t.Fatalf("kernel holds virtual server %v: %v", vs.Key, err)
		}
		if !slices.Contains(memory.DefaultSchedulers, vs.Scheduler) {
			t.Fatalf("kernel holds scheduler %q", vs.Scheduler)
		}
		ds, _ := k.IPVS.ListDestinations(vs.Key)
		for _, d := range ds {
			if _, err := parseServiceAddr(d.Address.String()); err != nil || d.Port == 0 || d.Weight > maxWeight {
				t.Fatalf("kernel holds real server %+v of %v", d, vs.Key)
			}
		}
	}
	bound, _ := k.Links.BoundAddresses(kernel.DummyDevice)
	for _, a := range bound {
		if _, err := parseServiceAddr(a.String()); err != nil {
			t.Fatalf("kube-ipvs0 holds %v: %v", a, err)
		}
	}
	sets, _ := k.IPSets.ListSets()
	for _, s := range sets {
		es, _ := k.IPSets.ListEntries(s.Name)
		for _, e := range es {
			if err := e.Validate(s); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, fam := range fuzzFamilies {
		for _, tb := range []kernel.Table{kernel.TableFilter, kernel.TableNAT} {
			b, err := k.IPTables.Save(context.Background(), fam, tb)
			if err != nil {
				t.Fatal(err)
			}
			dumps, err := kernel.ParseSave(b)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range dumps {
				for _, c := range d.Chains {
					builtin := kernel.IsBuiltinChain(d.Table, c.Name)
					if !builtin && !strings.HasPrefix(c.Name, "KUBE-") && c.Name != rules.ChainInCluster {
						t.Fatalf("%v %s: chain %s", fam, d.Table, c.Name)
					}
					for _, rule := range c.Rules {
						if builtin && !strings.Contains(rule, "-j KUBE-") {
							t.Fatalf("%v %s %s: rule %q", fam, d.Table, c.Name, rule)
						}
					}
				}
			}
		}
	}
}
