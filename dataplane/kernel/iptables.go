package kernel

import (
	"context"
	"fmt"
)

// Table is an iptables table name.
type Table string

const (
	TableFilter   Table = "filter"
	TableNAT      Table = "nat"
	TableMangle   Table = "mangle"
	TableRaw      Table = "raw"
	TableSecurity Table = "security"
)

// BuiltinChains returns the built-in chains of t in iptables-save order, or
// nil for an unknown table.
func BuiltinChains(t Table) []string {
	switch t {
	case TableFilter, TableSecurity:
		return []string{"INPUT", "FORWARD", "OUTPUT"}
	case TableNAT:
		return []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"}
	case TableMangle:
		return []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}
	case TableRaw:
		return []string{"PREROUTING", "OUTPUT"}
	}
	return nil
}

// IsBuiltinChain reports whether chain is built into table t.
func IsBuiltinChain(t Table, chain string) bool {
	for _, c := range BuiltinChains(t) {
		if c == chain {
			return true
		}
	}
	return false
}

// Backend is the iptables flavour the host uses.
type Backend string

const (
	BackendLegacy Backend = "legacy"
	BackendNFT    Backend = "nft"
)

// IPTablesInfo describes the iptables tools in use.
type IPTablesInfo struct {
	Backend Backend
	Version string // e.g. "1.8.9"
	// RandomFully: the MASQUERADE --random-fully option is available
	// (iptables >= 1.6.2).
	RandomFully bool
}

// IPTables applies and reads iptables rules in iptables-restore format.
//
// Contract:
//   - Restore applies payload with one `iptables-restore --noflush` (or
//     ip6tables-restore) call, so per table either everything applies or
//     nothing does: a ":CHAIN" line creates the chain or flushes it if it
//     exists (built-in chains are not flushed, their policy is set unless
//     "-"), chains not named keep their rules, "-X CHAIN" deletes an empty,
//     unreferenced chain, "-A/-I/-D/-F/-N/-P" work as in iptables.
//     A bad payload returns an error and leaves that table as it was.
//   - Save returns `iptables-save -t table` output (no counters); parse it
//     with ParseSave. A table never used may come back empty.
//   - Rules are compared as text: write them the way iptables-save prints
//     them (e.g. "-d 198.18.0.1/32 -p tcp -m tcp --dport 80") so a read-back
//     matches on every backend.
//   - Safe for concurrent use.
type IPTables interface {
	Restore(ctx context.Context, family Family, payload []byte) error
	Save(ctx context.Context, family Family, table Table) ([]byte, error)
	Info() IPTablesInfo
}

// IPTablesFingerprinter is implemented by an IPTables that can tell,
// without running a tool, whether a table may have changed: the agent then
// leaves out the iptables-save of a full pass when nothing changed since
// the last one it checked, and its drift probe sees a flushed chain.
//
// Contract:
//   - Fingerprint(family, tables...) returns one value for the tables
//     together (at least one), which differs from the one read before
//     whenever a rule, chain or policy of one of them changed in between;
//     rule counters are not part of it. It may also change when none did
//     (nf_tables: any ruleset change of the namespace).
//   - An error means unknown: the caller reads the tables instead.
//   - Safe for concurrent use.
type IPTablesFingerprinter interface {
	Fingerprint(family Family, tables ...Table) (uint64, error)
}

// ValidateIPTablesArgs checks family and table for IPTables calls.
func ValidateIPTablesArgs(family Family, table Table) error {
	if !family.Valid() {
		return fmt.Errorf("iptables: family must be inet or inet6: %w", ErrInvalid)
	}
	if table != "" && BuiltinChains(table) == nil {
		return fmt.Errorf("iptables: unknown table %q: %w", table, ErrInvalid)
	}
	return nil
}
