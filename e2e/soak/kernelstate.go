package soak

import (
	"encoding/json"
	"fmt"
	"strings"
)

// KernelState is what the guest helper kstate (e2e/soak/kstate) prints of
// a node agent's GetKernelState: the kernel against the desired state.
type KernelState struct {
	Differences    uint32            `json:"differences"`
	VirtualServers int               `json:"virtual_servers"`
	Addresses      int               `json:"addresses"`
	IPSets         int               `json:"ipsets"`
	Chains         int               `json:"chains"`
	NotInSync      []string          `json:"not_in_sync,omitempty"`
	Failed         map[string]string `json:"failed,omitempty"`
	ReadErrors     []string          `json:"read_errors,omitempty"`
	KernelErrors   []string          `json:"kernel_errors,omitempty"`
}

// KStatePackage is the guest helper's Go package (cluster.Options.GoPackages).
const KStatePackage = "./e2e/soak/kstate"

// ParseKernelState decodes kstate's output (one JSON line).
func ParseKernelState(out string) (KernelState, error) {
	var st KernelState
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &st); err != nil {
		return KernelState{}, fmt.Errorf("kstate output %q: %w", out, err)
	}
	return st, nil
}

// Err is nil when the kernel equals the agent's desired state as far as
// the agent compares it: no difference, no failed resource, no read error.
// Agents before 2026-12-06 compare IPVS and kube-ipvs0 only (see Complete).
func (s KernelState) Err() error {
	if s.Differences != 0 || len(s.Failed) > 0 || len(s.ReadErrors) > 0 {
		return fmt.Errorf("kernel against desired: %d differences %v, failed %v, read errors %v",
			s.Differences, s.NotInSync, s.Failed, s.ReadErrors)
	}
	return nil
}

// Complete is nil when the agent compared its ipsets and iptables chains
// too, so that Err covers them: an agent too old to compare them, or one
// with no desired state yet, is not taken for one in sync.
func (s KernelState) Complete() error {
	if s.IPSets == 0 || s.Chains == 0 {
		return fmt.Errorf("%d ipsets and %d iptables chains compared (the agent predates their comparison, or has no desired state yet)", s.IPSets, s.Chains)
	}
	return nil
}
