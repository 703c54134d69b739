// Package kernel defines the agent's narrow view of the Linux kernel: one
// interface per subsystem (IPVS, IPSets, Links, IPTables, Sysctl, Conntrack) with this
// package's own value types, so no netlink or moby type leaks into the
// reconciler.
//
// Implementations:
//   - kernel/memory: in memory, goroutine-safe, for unit tests and scale
//     simulation.
//   - kernel/linux: the real kernel (moby/ipvs, vishvananda/netlink,
//     iptables-restore, /proc/sys, ctnetlink).
//
// Both must pass the suite in kernel/contract; where they disagree the
// memory implementation is wrong.
//
// Error semantics follow the kernel and are exposed as sentinels (ErrExist,
// ErrNotFound, ErrBusy, ErrInvalid, ErrUnsupported) checked with errors.Is.
// IPVS, ipset entry and address writes are batches only (IPVS.Apply,
// IPSets.ApplyEntries, Links.ApplyAddresses): ops in order, each with its
// kind's semantics, one error per op; the Linux implementation sends many
// netlink requests per syscall. Besides them the interfaces write only to
// create sets and the dummy device, and settings (timeouts, sysctls,
// iptables-restore, conntrack deletion).
// Value types have Normalize methods: reads return normalized values, so a
// caller compares Normalize(desired) with what it reads.
package kernel
