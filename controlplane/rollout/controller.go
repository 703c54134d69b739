package rollout

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Engine is what the controller reads of the cluster model
// (*engine.Engine).
type Engine interface {
	// NodesMatching returns the known nodes r's node selector selects.
	NodesMatching(r *model.Rollout) []*model.Node
	// ServicesSelected returns the Services r applies to (not those naming
	// their own scheduler).
	ServicesSelected(r *model.Rollout) []model.ServiceKey
}

// Desired is the per-node desired state (*snapshot.Store).
type Desired interface {
	Get(node, name string) (*vsplanev1.Resource, bool)
}

// Config configures a Controller.
type Config struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Lease is namespace/name of the Lease the replicas elect the leader
	// with; Identity is this replica's name in it.
	LeaseNamespace, LeaseName, Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod: client-go's leader
	// election (defaults 15s, 10s, 2s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Interval between two passes over the rollouts while leading
	// (default 1s).
	Interval time.Duration
	// Rollouts lists the SchedulerRollouts (the watch's cache).
	Rollouts func() []*v1alpha1.SchedulerRollout
	Engine   Engine
	Desired  Desired
	// Agents returns every agent of the fleet with its acknowledged and
	// NACKed versions of names (inspect, fleet-wide).
	Agents func(ctx context.Context, names []string) ([]*vsplanev1.AgentInfo, error)
	// Problems returns the Services' problems (engine.AllProblems): the
	// leader records an Event on each Service whose scheduler annotation is
	// refused, once per distinct problem.
	Problems func() map[model.ServiceKey][]model.Problem
	Logger   *zap.Logger
	Now      func() time.Time
}

// Controller elects a leader among the replicas; the leader moves every
// SchedulerRollout's status on.
type Controller struct {
	cfg      Config
	log      *zap.Logger
	recorder record.EventRecorder
	leading  atomic.Bool
	// reported: the bad-scheduler problems already recorded as Events, by
	// Service (leader goroutine only).
	reported map[model.ServiceKey]string
}

// New returns a controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.Kube == nil || cfg.Dynamic == nil || cfg.Rollouts == nil || cfg.Engine == nil || cfg.Desired == nil || cfg.Agents == nil {
		return nil, errors.New("rollout: Kube, Dynamic, Rollouts, Engine, Desired and Agents are required")
	}
	if cfg.LeaseNamespace == "" || cfg.LeaseName == "" || cfg.Identity == "" {
		return nil, errors.New("rollout: lease namespace, name and identity are required")
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.Kube.CoreV1().Events("")})
	return &Controller{cfg: cfg, log: cfg.Logger, reported: map[model.ServiceKey]string{},
		recorder: b.NewRecorder(scheme, corev1.EventSource{Component: "vsplane-controlplane", Host: cfg.Identity})}, nil
}

// Leading reports whether this replica leads now.
func (c *Controller) Leading() bool { return c.leading.Load() }

// Run takes part in the election until ctx ends; while leading it moves the
// rollouts on every Interval.
func (c *Controller) Run(ctx context.Context) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.cfg.LeaseNamespace, Name: c.cfg.LeaseName},
		Client:     c.cfg.Kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.cfg.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: "vsplane-rollouts", ReleaseOnCancel: true,
			LeaseDuration: c.cfg.LeaseDuration, RenewDeadline: c.cfg.RenewDeadline, RetryPeriod: c.cfg.RetryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: c.lead,
				OnStoppedLeading: func() {
					c.leading.Store(false)
					c.log.Info("stopped leading scheduler rollouts")
				},
			},
		})
		if err != nil {
			return fmt.Errorf("rollout: leader election: %w", err)
		}
		le.Run(ctx) // returns when leadership is lost or ctx ends
	}
	return nil
}

func (c *Controller) lead(ctx context.Context) {
	c.leading.Store(true)
	c.log.Info("leading scheduler rollouts", zap.String("identity", c.cfg.Identity))
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		c.Reconcile(ctx)
		c.reportBadSchedulers()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Reconcile makes one pass over the rollouts: the oldest unfinished one
// progresses, the others wait; each changed status is written.
func (c *Controller) Reconcile(ctx context.Context) {
	ros := c.cfg.Rollouts()
	slices.SortFunc(ros, func(a, b *v1alpha1.SchedulerRollout) int {
		if d := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
	blockedBy := ""
	for _, ro := range ros {
		if err := c.reconcileOne(ctx, ro, blockedBy); err != nil {
			c.log.Warn("rollout pass failed; retrying", zap.String("rollout", ro.Name), zap.Error(err))
		}
		switch ro.Status.Phase {
		case v1alpha1.PhaseSucceeded, v1alpha1.PhaseRolledBack, v1alpha1.PhaseAborted, v1alpha1.PhaseFailed:
		default:
			if blockedBy == "" {
				blockedBy = ro.Name
			}
		}
	}
}

// reportBadSchedulers records a Warning Event on every Service whose
// scheduler annotation is refused (the Service keeps the fleet's
// scheduler), once per distinct problem; only the leader does, so one
// Event per problem, not one per replica.
func (c *Controller) reportBadSchedulers() {
	if c.cfg.Problems == nil {
		return
	}
	seen := map[model.ServiceKey]bool{}
	for key, problems := range c.cfg.Problems() {
		for _, p := range problems {
			if p.Reason != model.ReasonBadScheduler {
				continue
			}
			seen[key] = true
			if c.reported[key] == p.Detail {
				continue
			}
			c.reported[key] = p.Detail
			svc := &corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
				ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
			c.recorder.Event(svc, corev1.EventTypeWarning, "BadScheduler", p.Detail)
		}
	}
	for key := range c.reported {
		if !seen[key] {
			delete(c.reported, key)
		}
	}
}

// view gathers what Next decides from: the selected nodes, their agents'
// reports on the selected Services (fleet-wide) and the Services' names.
func (c *Controller) view(ctx context.Context, ro *v1alpha1.SchedulerRollout) (View, []model.ServiceKey, error) {
	m, _ := model.ConvertRollout(ro)
	view := View{Now: c.cfg.Now()}
	nodes := c.cfg.Engine.NodesMatching(m)
	services := c.cfg.Engine.ServicesSelected(m)
	names := make([]string, len(services))
	for i, k := range services {
		names[i] = wire.ServiceResource(k.Namespace, k.Name)
	}
	agents, err := c.cfg.Agents(ctx, names)
	if err != nil {
		return View{}, nil, fmt.Errorf("agents: %w", err)
	}
	byNode := make(map[string]*vsplanev1.AgentInfo, len(agents))
	for _, a := range agents {
		byNode[a.GetNodeName()] = a
	}
	source := "SchedulerRollout " + ro.Name
	for _, n := range nodes {
		a := byNode[n.Name]
		nd := Node{Name: n.Name, Capable: a != nil && slices.Contains(a.GetCapabilities().GetIpvsSchedulers(), ro.Spec.Scheduler)}
		if a != nil {
			nd.ApplyDuration = a.GetLastApplyDuration().AsDuration()
			nd.State, nd.Reason = c.nodeState(n.Name, names, a, source)
		} else {
			nd.Reason = reasonNotConnected
		}
		view.Nodes = append(view.Nodes, nd)
	}
	return view, services, nil
}

func (c *Controller) reconcileOne(ctx context.Context, ro *v1alpha1.SchedulerRollout, blockedBy string) error {
	view, _, err := c.view(ctx, ro)
	if err != nil {
		return err
	}
	if blockedBy != ro.Name {
		view.BlockedBy = blockedBy
	}
	st, events := Next(ro, view)
	if reflect.DeepEqual(st, ro.Status) {
		return nil
	}
	next := ro.DeepCopy()
	next.Status = st
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(next)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind("SchedulerRollout")
	if _, err := c.cfg.Dynamic.Resource(v1alpha1.Resource).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			return nil // the cache is behind; the next pass sees the newer object
		}
		return fmt.Errorf("status update: %w", err)
	}
	next.APIVersion, next.Kind = v1alpha1.GroupVersion.String(), "SchedulerRollout"
	for _, e := range events {
		typ := corev1.EventTypeNormal
		if e.Warning {
			typ = corev1.EventTypeWarning
		}
		c.recorder.Event(next, typ, e.Reason, e.Message)
		c.log.Info("rollout", zap.String("rollout", ro.Name), zap.String("event", e.Reason), zap.String("message", e.Message))
	}
	return nil
}

// nodeState says whether node's agent holds the rollout's change of every
// selected Service: a resource counts only once its desired version
// carries the rollout's scheduler (the engine has caught up with the
// status) and the agent acknowledged that version.
func (c *Controller) nodeState(node string, names []string, a *vsplanev1.AgentInfo, source string) (NodeState, string) {
	pending := false
	for _, name := range names {
		res, ok := c.cfg.Desired.Get(node, name)
		if !ok {
			continue // the Service gives this node nothing
		}
		if res.GetService().GetSchedulerSource() != source {
			pending = true // not reached yet, or the engine has not caught up
			continue
		}
		if e, ok := a.GetNacked()[name]; ok && strings.HasPrefix(e, res.GetVersion()+":") {
			return Failed, name + ": " + strings.TrimPrefix(e, res.GetVersion()+": ")
		}
		if a.GetAcknowledgedVersions()[name] != res.GetVersion() {
			pending = true
		}
	}
	if pending {
		return Pending, ""
	}
	return Updated, ""
}

// reasonNotConnected is a selected node's reason when its agent is not
// connected to any replica (inspection shows it even for nodes not reached).
const reasonNotConnected = "agent not connected"

// wireNodeStates maps a reached node's state to the inspection API's.
var wireNodeStates = map[NodeState]vsplanev1.RolloutNodeState{
	Pending: vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_PENDING,
	Updated: vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_UPDATED,
	Failed:  vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_FAILED,
}

// Progress describes rollout name per node (the inspection API's
// GetRollout); any replica can answer, leader or not.
func (c *Controller) Progress(ctx context.Context, name string) (*vsplanev1.GetRolloutResponse, bool, error) {
	var ro *v1alpha1.SchedulerRollout
	for _, r := range c.cfg.Rollouts() {
		if r.Name == name {
			ro = r
			break
		}
	}
	if ro == nil {
		return nil, false, nil
	}
	view, services, err := c.view(ctx, ro)
	if err != nil {
		return nil, true, err
	}
	resp := &vsplanev1.GetRolloutResponse{Name: ro.Name, Scheduler: ro.Spec.Scheduler, Phase: string(ro.Status.Phase),
		CurrentStep: ro.Status.CurrentStep}
	for _, s := range ro.Status.Steps {
		resp.StepNodes = append(resp.StepNodes, s.Nodes)
	}
	for _, k := range services {
		resp.Services = append(resp.Services, k.String())
	}
	slices.SortFunc(view.Nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	for _, n := range view.Nodes {
		rn := &vsplanev1.RolloutNode{NodeName: n.Name, Capable: n.Capable, Reason: n.Reason,
			State: vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_NOT_REACHED}
		if reaches(&ro.Status, ro, n.Name) {
			rn.State = wireNodeStates[n.State]
		} else if n.Reason != reasonNotConnected {
			rn.Reason = ""
		}
		resp.Nodes = append(resp.Nodes, rn)
	}
	return resp, true, nil
}
