package linux

// Test hooks of the batched write paths.

// BatchSends is how many sendmsg calls ApplyEntries has made.
func (h *IPSets) BatchSends() int { return h.batch.sends }

// BatchSends is how many sendmsg calls ApplyAddresses has made.
func (l *Links) BatchSends() int { return l.batch.sends }

// BreakBatch makes every later batch exchange of h fail (a bad socket).
func (h *IPSets) BreakBatch() { h.batch.close(); h.batch.fd = -1 }

// BreakBatch makes every later batch exchange of l fail (a bad socket).
func (l *Links) BreakBatch() { l.batch.close(); l.batch.fd = -1 }
