package tlsfiles

import "time"

// SetCheckInterval lets tests see file changes at the next handshake.
func SetCheckInterval(d time.Duration) { checkInterval = d }
