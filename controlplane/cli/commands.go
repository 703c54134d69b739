// Package cli is kubectl-vsplane, the kubectl plugin that inspects the
// control plane: it reads the user's kubeconfig, reaches the control plane
// through the API server (a port-forward to a Ready Pod of its Service) or
// at --address, sends the user's own bearer token, verifies the served
// certificate against the CA the control plane publishes in a ConfigMap,
// and renders InspectService's answers as tables, JSON or YAML, with exit
// codes scripts can test (exit.go).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// concurrency bounds the calls made at once (one per node).
const concurrency = 8

type options struct {
	kube   *genericclioptions.ConfigFlags
	target Target
	output string
	now    func() time.Time
	stdout io.Writer
	stderr io.Writer
}

// Main runs kubectl-vsplane with args (without the program name) and
// returns its exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := NewCommand(stdout, stderr)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err != nil && !errors.Is(err, errNotInSync) {
		fmt.Fprintf(stderr, "error: %v\n", err)
	}
	return ExitCode(err)
}

// NewCommand builds the command tree.
func NewCommand(stdout, stderr io.Writer) *cobra.Command {
	o := &options{kube: genericclioptions.NewConfigFlags(false), now: time.Now, stdout: stdout, stderr: stderr}
	// These flags of kubectl's would name the API server's credentials;
	// here --token, --certificate-authority and --tls-server-name are the
	// control plane's, and verification is never skipped.
	o.kube.BearerToken, o.kube.CAFile, o.kube.TLSServerName, o.kube.Insecure = nil, nil, nil, nil
	root := &cobra.Command{
		Use:   "kubectl-vsplane",
		Short: "Inspect the vsplane control plane: agents' sync, Services, rollouts, snapshots",
		Long: `kubectl vsplane asks the vsplane control plane through the API server (a
port-forward to its Service) or at --address, with your kubeconfig's token
(or --token), verifying TLS against the CA in ConfigMap
<namespace>/vsplane-controlplane-ca (or --certificate-authority).

Exit codes: 0 ok and in sync; 1 error; 2 usage; 3 something shown is not in
sync (agent behind, NACKing or holding a removal, Service not acknowledged,
rollout not succeeded, replica unreachable); 4 not found; 5 credentials
refused by the control plane.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q; see --help", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			_ = cmd.Help()
			return usagef("a command is required")
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	fs := root.PersistentFlags()
	o.kube.AddFlags(fs)
	fs.Lookup("namespace").Usage = "the control plane's namespace (default " + DefaultNamespace + ")"
	fs.StringVar(&o.target.Address, "address", "", "dial the control plane at host:port instead of port-forwarding to its Service")
	fs.StringVar(&o.target.Token, "token", "", "bearer token for the control plane (default: the kubeconfig's credentials)")
	fs.StringVar(&o.target.CAFile, "certificate-authority", "", "CA file to verify the control plane with (default: ConfigMap "+CAConfigMap+")")
	fs.StringVar(&o.target.ServerName, "tls-server-name", "", "name to verify in the control plane's certificate (default "+ServiceName+".<namespace>.svc)")
	fs.StringVarP(&o.output, "output", "o", OutputTable, "output format: table, json or yaml")

	root.AddCommand(o.statusCommand(), o.explainCommand(), o.rolloutCommand(), o.snapshotCommand())
	return root
}

func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("want %s, got %d arguments", what, len(args))
		}
		return nil
	}
}

// connect validates -o and opens the connection.
func (o *options) connect(ctx context.Context) (*Conn, error) {
	if err := checkOutput(o.output); err != nil {
		return nil, err
	}
	t := o.target
	if o.kube.Namespace != nil {
		t.Namespace = *o.kube.Namespace
	}
	return Connect(ctx, o.kube.ToRESTConfig, t, o.stderr)
}

func (o *options) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "One line per connected agent: replica, in sync or behind, last Ack, NACKs, held removals, draining, capabilities",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			r, err := Status(cmd.Context(), c.Inspect)
			if err != nil {
				return err
			}
			if err := renderStatus(o.stdout, o.output, r, o.now()); err != nil {
				return err
			}
			if !r.InSync() {
				return errNotInSync
			}
			return nil
		},
	}
}

// Status gathers every connected agent and its last report.
func Status(ctx context.Context, insp vsplanev1.InspectServiceClient) (StatusReport, error) {
	list, err := insp.ListAgents(ctx, &vsplanev1.ListAgentsRequest{OmitVersions: true})
	if err != nil {
		return StatusReport{}, err
	}
	r := StatusReport{Nodes: make([]NodeStatus, len(list.GetAgents())), UnreachableReplicas: list.GetUnreachableReplicas()}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(concurrency)
	for i, a := range list.GetAgents() {
		g.Go(func() error {
			st, err := nodeStatus(gctx, insp, a.GetNodeName())
			if err != nil {
				return err
			}
			// GetNodeStatus's AgentInfo is whole (ListAgents omits the
			// NACKed names with omit_versions) and newer.
			if st.GetAgent() != nil {
				a = st.GetAgent()
			}
			r.Nodes[i] = newNodeStatus(a, st.GetStatus())
			return nil
		})
	}
	return r, g.Wait()
}

// nodeStatus is the node's stream state and the agent's last report; nil
// when the agent is not connected (any more).
func nodeStatus(ctx context.Context, insp vsplanev1.InspectServiceClient, node string) (*vsplanev1.GetNodeStatusResponse, error) {
	st, err := insp.GetNodeStatus(ctx, &vsplanev1.GetNodeStatusRequest{NodeName: node})
	if status.Code(err) == codes.NotFound {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("status of node %s: %w", node, err)
	}
	return st, nil
}

func (o *options) explainCommand() *cobra.Command {
	var node string
	cmd := &cobra.Command{
		Use:   "explain NAMESPACE/SERVICE",
		Short: "Why a node gets what it gets for a Service, and whether its agent's kernel holds it (every connected node without --node)",
		Args:  exactArgs(1, "one NAMESPACE/SERVICE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, ok := strings.Cut(args[0], "/")
			if !ok {
				ns, name = "default", args[0]
			}
			if ns == "" || name == "" || strings.Contains(name, "/") {
				return usagef("want NAMESPACE/SERVICE, got %q", args[0])
			}
			c, err := o.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			es, err := Explain(cmd.Context(), c.Inspect, ns, name, node)
			if err != nil {
				return err
			}
			if err := renderExplanations(o.stdout, o.output, es); err != nil {
				return err
			}
			for _, e := range es {
				if !e.Acknowledged() {
					return errNotInSync
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "the node to explain (default: every node with a connected agent)")
	return cmd
}

// Explain explains Service ns/name for node, or for every connected agent's
// node when node is "".
func Explain(ctx context.Context, insp vsplanev1.InspectServiceClient, ns, name, node string) ([]Explanation, error) {
	nodes := []string{node}
	if node == "" {
		list, err := insp.ListAgents(ctx, &vsplanev1.ListAgentsRequest{OmitVersions: true})
		if err != nil {
			return nil, err
		}
		nodes = nodes[:0]
		for _, a := range list.GetAgents() {
			nodes = append(nodes, a.GetNodeName())
		}
		if len(nodes) == 0 {
			return nil, status.Error(codes.NotFound, "no agent is connected to the control plane; name a node with --node")
		}
	}
	out := make([]Explanation, len(nodes))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(concurrency)
	for i, n := range nodes {
		g.Go(func() error {
			r, err := insp.ExplainService(gctx, &vsplanev1.ExplainServiceRequest{NodeName: n, Namespace: ns, Name: name})
			if err != nil {
				return fmt.Errorf("explain %s/%s on node %s: %w", ns, name, n, err)
			}
			st, err := nodeStatus(gctx, insp, n)
			if err != nil {
				return err
			}
			out[i] = newExplanation(r, st.GetStatus())
			return nil
		})
	}
	return out, g.Wait()
}

func (o *options) rolloutCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "rollout", Short: "SchedulerRollouts' progress", Args: exactArgs(0, "a subcommand: status or watch"),
		RunE: func(*cobra.Command, []string) error { return usagef("want a subcommand: status or watch") }}
	var watch bool
	var interval time.Duration
	run := func(cmd *cobra.Command, args []string) error {
		c, err := o.connect(cmd.Context())
		if err != nil {
			return err
		}
		defer c.Close()
		return o.rolloutStatus(cmd.Context(), c.Inspect, args[0], watch || cmd.Name() == "watch", interval)
	}
	status := &cobra.Command{Use: "status NAME", Short: "Per-step and per-node progress of a SchedulerRollout (-w: until it ends)",
		Args: exactArgs(1, "one SchedulerRollout NAME"), RunE: run}
	status.Flags().BoolVarP(&watch, "watch", "w", false, "print the progress on every change until the rollout ends")
	watchCmd := &cobra.Command{Use: "watch NAME", Short: "rollout status --watch",
		Args: exactArgs(1, "one SchedulerRollout NAME"), RunE: run}
	for _, c := range []*cobra.Command{status, watchCmd} {
		c.Flags().DurationVar(&interval, "interval", 2*time.Second, "how often to ask while watching")
	}
	cmd.AddCommand(status, watchCmd)
	return cmd
}

// rolloutObserveGrace is how long a watch waits for the control plane to
// observe a rollout it does not know yet.
const rolloutObserveGrace = 30 * time.Second

// rolloutStatus prints the rollout once, or on every change until it
// reaches a terminal phase; the result is the last state's. Watching, a
// rollout the control plane does not know yet is waited for
// (rolloutObserveGrace).
func (o *options) rolloutStatus(ctx context.Context, insp vsplanev1.InspectServiceClient, name string, watch bool, interval time.Duration) error {
	if watch && interval <= 0 {
		return usagef("--interval must be positive")
	}
	var last string
	var tick *time.Ticker
	var unseenSince time.Time // watching, not yet seen: since when
	for {
		r, err := insp.GetRollout(ctx, &vsplanev1.GetRolloutRequest{Name: name})
		switch {
		case err == nil:
		case watch && last == "" && status.Code(err) == codes.NotFound:
			// The control plane answers from its informer, which sees a
			// rollout a moment after `kubectl apply` returned: wait for it,
			// as `kubectl rollout status` waits for its object to be
			// observed, but not for ever (a misspelt name).
			if unseenSince.IsZero() {
				unseenSince = o.now()
				fmt.Fprintf(o.stderr, "Waiting up to %v for the control plane to observe rollout %q...\n", rolloutObserveGrace, name)
			} else if o.now().Sub(unseenSince) >= rolloutObserveGrace {
				return err
			}
		default:
			return err
		}
		if err != nil {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(min(interval, time.Second)):
			}
			continue
		}
		if s := string(protoJSON(r)); s != last {
			if last != "" && o.output == OutputTable {
				fmt.Fprintln(o.stdout)
			}
			last = s
			if err := renderRollout(o.stdout, o.output, r); err != nil {
				return err
			}
		}
		if !watch || slices.Contains(terminalPhases, r.GetPhase()) {
			if !rolloutDone(r) {
				return errNotInSync
			}
			return nil
		}
		if tick == nil {
			tick = time.NewTicker(interval)
			defer tick.Stop()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (o *options) snapshotCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot NODE",
		Short: "A node's desired state (-o json|yaml for all of it)",
		Args:  exactArgs(1, "one NODE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			r, err := c.Inspect.GetNodeSnapshot(cmd.Context(), &vsplanev1.GetNodeSnapshotRequest{NodeName: args[0]})
			if err != nil {
				return err
			}
			return renderSnapshot(o.stdout, o.output, r)
		},
	}
}
