package wire

// FloorResult is e2e/vm/cmd/kernelfloor's report (e2e/vmbench's cold-start
// floor): the writes of a namespace's state written again into an empty
// one by vsplane's kernel layer alone, batched, and how long the kernel
// took for them.
type FloorResult struct {
	VirtualServers int     `json:"virtual_servers"`
	RealServers    int     `json:"real_servers"`
	Addresses      int     `json:"addresses"`
	SetEntries     int     `json:"set_entries"`
	Writes         int     `json:"writes"`
	Seconds        float64 `json:"seconds"`
	IPVSSeconds    float64 `json:"ipvs_seconds"`
	AddrSeconds    float64 `json:"address_seconds"`
	SetSeconds     float64 `json:"set_seconds"`
	WritesPerSec   float64 `json:"writes_per_second"`
}
