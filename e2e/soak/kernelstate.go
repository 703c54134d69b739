package soak

// KernelState is what the guest helper kstate (e2e/soak/kstate) prints of
// a node agent's GetKernelState: the kernel against the desired state.
type KernelState struct {
	Differences    uint32            `json:"differences"`
	VirtualServers int               `json:"virtual_servers"`
	Addresses      int               `json:"addresses"`
	NotInSync      []string          `json:"not_in_sync,omitempty"`
	Failed         map[string]string `json:"failed,omitempty"`
	ReadErrors     []string          `json:"read_errors,omitempty"`
	KernelErrors   []string          `json:"kernel_errors,omitempty"`
}
