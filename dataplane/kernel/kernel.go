package kernel

// Kernel bundles one implementation of every subsystem, all acting on the
// same network namespace.
type Kernel struct {
	IPVS      IPVS
	IPSets    IPSets
	Links     Links
	IPTables  IPTables
	Sysctl    Sysctl
	Conntrack Conntrack
}
