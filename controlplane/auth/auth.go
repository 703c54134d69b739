// Package auth decides who talks to the control plane, the Kubernetes way:
// bearer tokens checked by the API server (TokenReview), permissions by RBAC
// (SubjectAccessReview).
//
//   - Agents present a projected ServiceAccount token with audience
//     AgentAudience, bound to their Pod. The API server's review of such a
//     token names the Pod's node in the user's extra
//     (authentication.kubernetes.io/node-name): that node, never the Hello,
//     is the agent's identity (Agents.Node).
//   - Inspection callers (grpcurl users, other replicas) present any token
//     the API server accepts; they need "get" on inspection.vsplane.io
//     (Inspection.Authorize; the vsplane-inspector ClusterRole grants it).
//
// Reviews are cached for a token's lifetime (at most CacheTTL), in a bounded
// cache, so a reconnect storm costs the API server one review per agent.
package auth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// AgentAudience is the audience of the agents' projected tokens.
const AgentAudience = "vsplane"

// NodeNameExtra is the user-extra key in which the API server reports the
// node of the Pod a token is bound to.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// Inspection is what an inspection caller needs: verb "get" on resource
// "inspection" of API group "vsplane.io" (no such object exists; RBAC rules
// name it like any resource).
var Inspection = authzv1.ResourceAttributes{Group: "vsplane.io", Resource: "inspection", Verb: "get"}

// Defaults of the caches.
const (
	// CacheTTL bounds how long a successful review is reused (and a token's
	// own expiry bounds it further).
	CacheTTL = 5 * time.Minute
	// NegativeTTL is how long a rejected token stays rejected without
	// asking the API server again (bounds the cost of a bad-token flood).
	NegativeTTL = 10 * time.Second
	// CacheSize bounds each cache (entries beyond it evict the oldest).
	CacheSize = 16384
)

// BearerToken returns the token of the call's "authorization: Bearer ..."
// metadata.
func BearerToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get("authorization")
	if len(v) == 0 {
		return "", status.Error(codes.Unauthenticated, "no bearer token: send 'authorization: Bearer <token>'")
	}
	scheme, tok, ok := strings.Cut(v[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(tok) == "" {
		return "", status.Error(codes.Unauthenticated, "malformed authorization metadata: want 'Bearer <token>'")
	}
	return strings.TrimSpace(tok), nil
}

// Reviewer reviews tokens with the API server for one set of audiences.
type Reviewer struct {
	client    kubernetes.Interface
	audiences []string
	now       func() time.Time
	cache     *ttlCache[authnv1.UserInfo]
}

// NewReviewer returns a Reviewer for audiences (nil: the API server's own).
func NewReviewer(client kubernetes.Interface, audiences ...string) *Reviewer {
	return &Reviewer{client: client, audiences: audiences, now: time.Now, cache: newTTLCache[authnv1.UserInfo](CacheSize)}
}

// Review returns the user a token authenticates as, or an Unauthenticated
// status saying why not.
func (r *Reviewer) Review(ctx context.Context, token string) (authnv1.UserInfo, error) {
	key := hashKey(token)
	if u, err, ok := r.cache.get(key, r.now()); ok {
		return u, err
	}
	tr, err := r.client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: r.audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		// The API server could not be asked: not the caller's fault, not cached.
		return authnv1.UserInfo{}, status.Errorf(codes.Unavailable, "cannot review the token with the API server: %v", err)
	}
	if !tr.Status.Authenticated {
		why := tr.Status.Error
		if why == "" {
			why = "not authenticated"
		}
		err := status.Errorf(codes.Unauthenticated, "token rejected by the API server (audiences %v): %s", r.audiences, why)
		r.cache.put(key, authnv1.UserInfo{}, err, r.now().Add(NegativeTTL))
		return authnv1.UserInfo{}, err
	}
	until := r.now().Add(CacheTTL)
	if exp, ok := expiry(token); ok && exp.Before(until) {
		until = exp
	}
	r.cache.put(key, tr.Status.User, nil, until)
	return tr.Status.User, nil
}

// Agents authenticates agent streams.
type Agents struct {
	reviewer *Reviewer
	// accounts are the ServiceAccounts agents run as ("namespace/name").
	accounts map[string]bool
}

// NewAgents returns an authenticator for agents running as one of the
// ServiceAccounts ("namespace/name").
func NewAgents(client kubernetes.Interface, serviceAccounts ...string) *Agents {
	a := &Agents{reviewer: NewReviewer(client, AgentAudience), accounts: map[string]bool{}}
	for _, sa := range serviceAccounts {
		a.accounts[sa] = true
	}
	return a
}

// Node returns the node the call's credentials belong to (stream.Options.
// Authenticate): Unauthenticated without a valid token of audience
// AgentAudience, PermissionDenied for a token of another ServiceAccount or
// one not bound to a Pod on a node.
func (a *Agents) Node(ctx context.Context) (string, error) {
	tok, err := BearerToken(ctx)
	if err != nil {
		return "", err
	}
	u, err := a.reviewer.Review(ctx, tok)
	if err != nil {
		return "", err
	}
	ns, name, ok := serviceAccount(u.Username)
	if !ok || !a.accounts[ns+"/"+name] {
		return "", status.Errorf(codes.PermissionDenied, "token of %q is not an agent's (ServiceAccounts %v)", u.Username, slices.Sorted(maps.Keys(a.accounts)))
	}
	nodes := u.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return "", status.Errorf(codes.PermissionDenied, "token of %q is not bound to a Pod on a node; mount a projected ServiceAccount token (audience %q)", u.Username, AgentAudience)
	}
	return nodes[0], nil
}

// Inspectors authorizes inspection calls.
type Inspectors struct {
	client   kubernetes.Interface
	reviewer *Reviewer
	now      func() time.Time
	sars     *ttlCache[struct{}]
}

// NewInspectors returns an authorizer for inspection callers.
func NewInspectors(client kubernetes.Interface) *Inspectors {
	return &Inspectors{client: client, reviewer: NewReviewer(client), now: time.Now, sars: newTTLCache[struct{}](CacheSize)}
}

// Authorize checks the call's bearer token and that its user may get
// inspection.vsplane.io.
func (i *Inspectors) Authorize(ctx context.Context) error {
	tok, err := BearerToken(ctx)
	if err != nil {
		return err
	}
	u, err := i.reviewer.Review(ctx, tok)
	if err != nil {
		return err
	}
	key := hashKey(u.Username + "\x00" + u.UID + "\x00" + strings.Join(u.Groups, ","))
	if _, err, ok := i.sars.get(key, i.now()); ok {
		return err
	}
	attrs := Inspection
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		ResourceAttributes: &attrs, User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra(u.Extra),
	}}
	resp, err := i.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return status.Errorf(codes.Unavailable, "cannot check access with the API server: %v", err)
	}
	var decision error
	if !resp.Status.Allowed {
		decision = status.Errorf(codes.PermissionDenied, "%q may not %s %s.%s (bind the vsplane-inspector ClusterRole)%s",
			u.Username, attrs.Verb, attrs.Resource, attrs.Group, reason(resp.Status.Reason))
	}
	i.sars.put(key, struct{}{}, decision, i.now().Add(NegativeTTL))
	return decision
}

func reason(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

func extra(in map[string]authnv1.ExtraValue) map[string]authzv1.ExtraValue {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]authzv1.ExtraValue, len(in))
	for k, v := range in {
		out[k] = authzv1.ExtraValue(v)
	}
	return out
}

// serviceAccount splits "system:serviceaccount:<ns>:<name>".
func serviceAccount(user string) (ns, name string, ok bool) {
	rest, ok := strings.CutPrefix(user, "system:serviceaccount:")
	if !ok {
		return "", "", false
	}
	return strings.Cut(rest, ":")
}

func hashKey(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// expiry reads the exp claim of a JWT without verifying it (the API server
// did): it only shortens how long a review is cached.
func expiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp == 0 {
		return time.Time{}, false
	}
	return time.Unix(claims.Exp, 0), true
}

// ttlCache is a bounded map of results with expiry times; when full, the
// entry that expires first is evicted.
type ttlCache[V any] struct {
	max int
	mu  sync.Mutex
	m   map[[32]byte]cacheEntry[V]
}

type cacheEntry[V any] struct {
	v     V
	err   error
	until time.Time
}

func newTTLCache[V any](max int) *ttlCache[V] {
	return &ttlCache[V]{max: max, m: map[[32]byte]cacheEntry[V]{}}
}

func (c *ttlCache[V]) get(k [32]byte, now time.Time) (V, error, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !now.Before(e.until) {
		delete(c.m, k)
		var zero V
		return zero, nil, false
	}
	return e.v, e.err, true
}

func (c *ttlCache[V]) put(k [32]byte, v V, err error, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		var oldest [32]byte
		first := true
		var oldestUntil time.Time
		for key, e := range c.m {
			if first || e.until.Before(oldestUntil) {
				oldest, oldestUntil, first = key, e.until, false
			}
		}
		delete(c.m, oldest)
	}
	c.m[k] = cacheEntry[V]{v: v, err: err, until: until}
}

// Len is the number of cached entries (tests).
func (c *ttlCache[V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
