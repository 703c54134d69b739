// Package client is the agent's side of the vsplane.v1.AgentService stream:
// it dials the control plane, says Hello with the versions the node holds,
// hands every Delta to an Applier and answers with its Ack, and reconnects
// with exponential backoff and jitter.
//
// Fail-static: while disconnected the client applies nothing and deletes
// nothing; the kernel keeps whatever was last programmed. On reconnect the
// Hello carries Applier.Versions(), so the control plane sends only what
// changed meanwhile. A client that holds versions (an agent restarted
// with its saved state) and every client whose last control plane
// announced that it resumes by system version
// (internal/wire.ResumeBySystemVersionHeader) send only the system version
// of those versions: a fleet reconnecting after a replica is lost, or
// restarted as a whole, uploads a few bytes per node instead of every
// version, and lists them only when asked (VersionsRequest). A digest sent
// to a control plane that did not announce it is never acted on: that
// stream is left and the next one lists (one refused stream per agent
// process against a control plane from before 7454268, 2026-12-01).
//
// Several control-plane replicas can be given (Config.Targets): every
// reconnect goes to another one, chosen at random, so agents spread over
// the replicas and a broken or starting replica is left quickly; a replica
// that sends no first Delta within FirstDeltaTimeout (it is still computing
// its first full state) counts as failed.
//
// Defence in depth (removal.go): a first Delta after (re)connect that would
// remove more than MaxRemovalShare of the Services the node holds is not
// applied at once; it is held and applied only if a control plane still
// says so after RemovalConfirmation.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Applier programs Deltas into the node. It is implemented by the reconciler
// and owns "what the agent holds".
type Applier interface {
	// Apply applies delta (upserts, then removals; removed names the Applier
	// does not hold are not an error) and returns its outcome: ACK when every
	// resource applied, NACK with one ResourceError per failed resource
	// otherwise. Calls are sequential, in stream order. The client overwrites
	// the Ack's nonce with the Delta's; a nil Ack is sent as a NACK. ctx is the
	// client's lifetime context, NOT the stream's: a disconnect does not abort
	// an apply in progress.
	Apply(ctx context.Context, delta *vsplanev1.Delta) *vsplanev1.Ack
	// Versions returns name -> version of every resource the node holds now
	// (successfully applied). The caller may keep the map; return a copy.
	Versions() map[string]string
}

// Config configures a Client.
type Config struct {
	// Targets are the control-plane replicas' addresses (gRPC targets, e.g.
	// "host:port"); at least one.
	Targets []string
	// NodeName is this node's Kubernetes Node name; required.
	NodeName     string
	AgentVersion string
	// Capabilities is called for every Hello; nil sends none.
	Capabilities func() *vsplanev1.Capabilities
	// Applier is required.
	Applier Applier
	Logger  *zap.Logger
	// BackoffBase and BackoffMax bound the reconnect delay (defaults 500ms, 30s).
	// The delay doubles per failed attempt, with jitter in [d/2, d], and resets
	// after a stream that delivered at least one Delta.
	BackoffBase, BackoffMax time.Duration
	// MaxRecvMsgSize bounds one received Delta; 0 means DefaultMaxRecvMsgSize.
	// The first Delta carries a node's whole state.
	MaxRecvMsgSize int
	// Credentials secure the connection (TLS); nil means plaintext.
	Credentials credentials.TransportCredentials
	// Token, if set, is sent with every stream (the agent's projected
	// ServiceAccount token, see internal/bearer); it requires Credentials.
	Token credentials.PerRPCCredentials
	// DialOptions are appended to the defaults (Credentials, Token,
	// keepalive, connect backoff bounded by BackoffMax).
	DialOptions []grpc.DialOption
	// OnStreamEnd, if set, is called after each stream ends (tests, metrics).
	OnStreamEnd func(err error)
	// Trace, if set, is called as each connection reaches each Step
	// (trace.go), from gRPC's and the stream's goroutines.
	Trace func(Step)
	// FirstDeltaTimeout: a stream without a first Delta this long after its
	// Hello is closed and another target tried (default 30s).
	FirstDeltaTimeout time.Duration
	// MaxRemovalShare and RemovalConfirmation configure the mass-removal
	// guard (see removal.go). A first Delta removing more than this share
	// of the Services held (default 0.5; 1 or more disables the guard) is
	// held for RemovalConfirmation (default 30s).
	MaxRemovalShare     float64
	RemovalConfirmation time.Duration
	// OnRemovalHeld, if set, is called whenever the guard starts or stops
	// holding a Delta (nil when it stops).
	OnRemovalHeld func(*vsplanev1.HeldRemoval)
	// Now is the clock the guard dates and ages a held Delta by (default
	// time.Now); tests may replace it.
	Now func() time.Time
}

// DefaultMaxRecvMsgSize (256 MiB): gRPC's default of 4 MiB is too small for
// the first Delta of a node with many Services.
const DefaultMaxRecvMsgSize = 256 << 20

// Client runs the agent stream. Create with New, then call Run.
type Client struct {
	cfg       Config
	log       *zap.Logger
	connected atomic.Bool
	guard     removalGuard
	// resumeBySys: the next Hello may send only the system version held.
	// True until a control plane did not announce that it resumes by
	// system version; then what the last stream's announced.
	resumeBySys atomic.Bool

	statusMu   sync.Mutex
	lastStatus *vsplanev1.AgentStatus
	statusCh   chan struct{}
}

// New validates cfg and returns a Client.
func New(cfg Config) (*Client, error) {
	if len(cfg.Targets) == 0 {
		return nil, errors.New("client: at least one target is required")
	}
	for _, t := range cfg.Targets {
		if strings.TrimSpace(t) == "" {
			return nil, fmt.Errorf("client: empty target in %q", cfg.Targets)
		}
	}
	if cfg.NodeName == "" {
		return nil, errors.New("client: NodeName is required")
	}
	if cfg.Applier == nil {
		return nil, errors.New("client: Applier is required")
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 500 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 30 * time.Second
	}
	if cfg.MaxRecvMsgSize <= 0 {
		cfg.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if cfg.FirstDeltaTimeout <= 0 {
		cfg.FirstDeltaTimeout = 30 * time.Second
	}
	if cfg.MaxRemovalShare <= 0 {
		cfg.MaxRemovalShare = DefaultMaxRemovalShare
	}
	if cfg.RemovalConfirmation <= 0 {
		cfg.RemovalConfirmation = DefaultRemovalConfirmation
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Token != nil && cfg.Token.RequireTransportSecurity() && cfg.Credentials == nil {
		return nil, errors.New("client: a token is only sent over TLS; Credentials are required")
	}
	if cfg.BackoffMax < cfg.BackoffBase {
		return nil, fmt.Errorf("client: BackoffMax %v < BackoffBase %v", cfg.BackoffMax, cfg.BackoffBase)
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	c := &Client{cfg: cfg, log: log, statusCh: make(chan struct{}, 1)}
	c.guard = removalGuard{maxShare: cfg.MaxRemovalShare, confirm: cfg.RemovalConfirmation, log: log, notify: cfg.OnRemovalHeld}
	// An agent restarted with its saved state tries the digest first.
	c.resumeBySys.Store(true)
	return c, nil
}

// Connected reports whether a stream is open and its Hello was sent.
func (c *Client) Connected() bool { return c.connected.Load() }

// SetStatus records the agent's status; it is sent now if connected, and
// again after every reconnect. Only the latest status is kept.
func (c *Client) SetStatus(st *vsplanev1.AgentStatus) {
	c.statusMu.Lock()
	c.lastStatus = st
	c.statusMu.Unlock()
	select {
	case c.statusCh <- struct{}{}:
	default:
	}
}

// Run connects and serves streams until ctx ends; it returns nil then, or an
// error only if a connection cannot be set up at all (bad target).
func (c *Client) Run(ctx context.Context) error {
	creds := c.cfg.Credentials
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	if c.cfg.Trace != nil {
		creds = tracedCredentials{TransportCredentials: creds, trace: c.cfg.Trace}
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.cfg.MaxRecvMsgSize)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: 30 * time.Second, Timeout: 20 * time.Second, PermitWithoutStream: true,
		}),
		// Bound gRPC's own transport reconnect delay so a restarted control
		// plane is found within BackoffMax (gRPC's default max is 120s).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay: c.cfg.BackoffBase, Multiplier: 1.6, Jitter: 0.2, MaxDelay: c.cfg.BackoffMax,
			},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	if c.cfg.Token != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(c.cfg.Token))
	}
	opts = append(opts, c.cfg.DialOptions...)
	apis := make([]vsplanev1.AgentServiceClient, len(c.cfg.Targets))
	for i, target := range c.cfg.Targets {
		conn, err := grpc.NewClient(target, opts...)
		if err != nil {
			return fmt.Errorf("client: dial %q: %w", target, err)
		}
		defer conn.Close()
		apis[i] = vsplanev1.NewAgentServiceClient(conn)
	}

	attempt := 0
	current := rand.N(len(apis)) // agents start spread over the replicas
	for {
		healthy, err := c.runStream(ctx, apis[current], c.cfg.Targets[current])
		if c.cfg.OnStreamEnd != nil {
			c.cfg.OnStreamEnd(err)
		}
		if ctx.Err() != nil {
			return nil
		}
		if healthy {
			attempt = 0
		}
		d := c.backoff(attempt)
		attempt++
		next := c.nextTarget(current)
		c.log.Warn("agent stream ended; reconnecting (fail-static: kernel state kept)",
			zap.Error(err), zap.String("target", c.cfg.Targets[current]), zap.String("next", c.cfg.Targets[next]),
			zap.Duration("backoff", d), zap.Int("attempt", attempt))
		current = next
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// nextTarget picks the target of the next attempt: any other one, at
// random, so the agents of a replica that went away spread over the rest.
func (c *Client) nextTarget(current int) int {
	n := len(c.cfg.Targets)
	if n == 1 {
		return 0
	}
	return (current + 1 + rand.N(n-1)) % n
}

// backoff is min(max, base*2^attempt), jittered into [d/2, d].
func (c *Client) backoff(attempt int) time.Duration {
	d := c.cfg.BackoffMax
	if attempt < 30 {
		if b := c.cfg.BackoffBase << attempt; b > 0 && b < d {
			d = b
		}
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// runStream serves one stream: Hello, the status sender, then every Delta
// applied and acknowledged in order. healthy reports whether it delivered
// a Delta.
func (c *Client) runStream(ctx context.Context, api vsplanev1.AgentServiceClient, target string) (healthy bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := api.Connect(sctx)
	if err != nil {
		return false, fmt.Errorf("open stream: %w", err)
	}
	var sendMu sync.Mutex // acks (this goroutine) and status (below) share the stream
	send := func(m *vsplanev1.ConnectRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(m)
	}
	held, bySys, err := c.sendHello(send)
	if err != nil {
		return false, err
	}
	c.connected.Store(true)
	defer c.connected.Store(false)
	c.trace(StepHelloSent)
	c.log.Info("agent stream open", zap.String("target", target), zap.Int("heldResources", held),
		zap.Bool("resumeBySystemVersion", bySys))
	go c.sendStatuses(sctx, send)

	// A replica still computing its first full state holds the stream; do
	// not wait for it forever when another may be ready.
	firstDelta := time.AfterFunc(c.cfg.FirstDeltaTimeout, cancel)
	defer firstDelta.Stop()
	first, firstResponse := true, true
	for {
		resp, err := st.Recv()
		if err != nil {
			if first && !firstDelta.Stop() && ctx.Err() == nil {
				return false, fmt.Errorf("no first Delta from %s within %v (replica not ready?)", target, c.cfg.FirstDeltaTimeout)
			}
			if errors.Is(err, io.EOF) {
				err = errors.New("control plane closed the stream")
			}
			return healthy, err
		}
		if firstResponse {
			firstResponse = false
			c.trace(StepFirstResponse)
			// The headers came with this first message.
			md, _ := st.Header()
			announced := len(md.Get(wire.ResumeBySystemVersionHeader)) > 0
			c.resumeBySys.Store(announced)
			if bySys && !announced {
				// An older control plane took the Hello as "holds nothing"
				// and would never send removals for what is held: apply
				// nothing from it and list every version next time.
				return true, fmt.Errorf("%s does not resume by system version (an older control plane?); reconnecting with every held version", target)
			}
		}
		if resp.GetVersionsRequest() != nil {
			if !bySys || !first {
				return healthy, fmt.Errorf("unexpected VersionsRequest from %s", target)
			}
			versions := c.cfg.Applier.Versions()
			c.log.Info("control plane asked for every held version", zap.Int("heldResources", len(versions)))
			if err := send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_HeldVersions{
				HeldVersions: &vsplanev1.HeldVersions{ResourceVersions: versions}}}); err != nil {
				return false, fmt.Errorf("send HeldVersions: %w", err)
			}
			continue
		}
		delta := resp.GetDelta()
		if delta == nil {
			c.log.Warn("ignoring ConnectResponse without a Delta")
			continue
		}
		if first {
			firstDelta.Stop()
			first = false
			if hold := c.guard.check(delta, c.cfg.Applier.Versions(), target, c.cfg.Now()); hold > 0 {
				// Not applied, not acknowledged: keep the stream (the
				// control plane sees the hold in AgentStatus) for the
				// confirmation period, then ask again, maybe elsewhere.
				t := time.NewTimer(hold)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
				return true, fmt.Errorf("holding a first Delta that removes most Services; asking the control plane again")
			}
		}
		ack := c.apply(ctx, delta)
		if !healthy {
			c.trace(StepFirstDeltaApplied)
		}
		healthy = true
		if err := send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Ack{Ack: ack}}); err != nil {
			return healthy, fmt.Errorf("send Ack: %w", err)
		}
	}
}

// trace reports step to Config.Trace, if set.
func (c *Client) trace(step Step) {
	if c.cfg.Trace != nil {
		c.cfg.Trace(step)
	}
}

// sendHello says which node this is and what it holds: every version, or
// only their system version (bySys) if it holds some and no control plane
// said it does not resume by one. It returns how many resources the node
// holds.
func (c *Client) sendHello(send func(*vsplanev1.ConnectRequest) error) (held int, bySys bool, err error) {
	versions := c.cfg.Applier.Versions()
	hello := &vsplanev1.Hello{NodeName: c.cfg.NodeName, AgentVersion: c.cfg.AgentVersion}
	if bySys = c.resumeBySys.Load() && len(versions) > 0; bySys {
		hello.HeldSystemVersion, hello.HeldCount = wire.SystemVersion(versions), uint32(len(versions))
	} else {
		hello.ResourceVersions = versions
	}
	if c.cfg.Capabilities != nil {
		hello.Capabilities = c.cfg.Capabilities()
	}
	if err := send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Hello{Hello: hello}}); err != nil {
		return 0, bySys, fmt.Errorf("send Hello: %w", err)
	}
	return len(versions), bySys, nil
}

// sendStatuses sends the current status now, then on every SetStatus,
// until ctx (the stream) ends.
func (c *Client) sendStatuses(ctx context.Context, send func(*vsplanev1.ConnectRequest) error) {
	sendStatus := func() {
		c.statusMu.Lock()
		s := c.lastStatus
		c.statusMu.Unlock()
		if s == nil {
			return
		}
		if err := send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Status{Status: s}}); err != nil {
			c.log.Debug("send status failed", zap.Error(err))
		}
	}
	sendStatus()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.statusCh:
			sendStatus()
		}
	}
}

// apply hands delta to the Applier and returns the Ack to send: its nonce,
// an apply duration, and a status consistent with its errors.
func (c *Client) apply(ctx context.Context, delta *vsplanev1.Delta) *vsplanev1.Ack {
	start := time.Now()
	ack := c.cfg.Applier.Apply(ctx, delta)
	if ack == nil {
		ack = &vsplanev1.Ack{Status: vsplanev1.AckStatus_ACK_STATUS_NACK,
			Errors: []*vsplanev1.ResourceError{{Message: "applier returned no Ack"}}}
	}
	ack.Nonce = delta.GetNonce()
	if ack.ApplyDuration == nil {
		ack.ApplyDuration = durationpb.New(time.Since(start))
	}
	if ack.Status == vsplanev1.AckStatus_ACK_STATUS_UNSPECIFIED {
		ack.Status = vsplanev1.AckStatus_ACK_STATUS_ACK
		if len(ack.Errors) > 0 {
			ack.Status = vsplanev1.AckStatus_ACK_STATUS_NACK
		}
	}
	c.log.Debug("applied delta", zap.String("nonce", delta.GetNonce()),
		zap.Int("resources", len(delta.GetResources())), zap.Int("removed", len(delta.GetRemoved())),
		zap.Stringer("status", ack.Status))
	return ack
}
