// Package measure holds what the e2e benchmarks and tests share about the
// machine they run on: a process's CPU times and memory from /proc, the load
// average, the repository root (where caches and reports live), and a report
// written as JSON and Markdown side by side.
//
// It depends on the standard library only, so the test bed's guest programs
// (e2e/vm/cmd/ipvsprobe) use it too.
package measure
