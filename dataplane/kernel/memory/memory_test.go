package memory_test

import (
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/contract"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
)

var (
	_ contract.SetCleaner   = (*memory.IPSets)(nil)
	_ contract.DummyDeleter = (*memory.Links)(nil)
)

func TestContract(t *testing.T) {
	contract.Run(t, func(t *testing.T) kernel.Kernel { return memory.New().Kernel() })
}

// TestContractSharedKernel runs the suite against one kernel shared by all
// tests, the way it runs against the real kernel.
func TestContractSharedKernel(t *testing.T) {
	k := memory.New().Kernel()
	contract.Run(t, func(t *testing.T) kernel.Kernel { return k })
}

func TestAddressWatcherContract(t *testing.T) {
	contract.RunAddressWatcher(t, memory.New().Kernel().Links)
}

func TestDestinationDumperContract(t *testing.T) {
	contract.RunDestinationDumper(t, memory.New().Kernel().IPVS, true)
}

func TestVirtualServerDigesterContract(t *testing.T) {
	contract.RunVirtualServerDigester(t, memory.New().Kernel().IPVS)
}
