package auth

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestBearerToken(t *testing.T) {
	for _, tc := range []struct {
		md   []string
		want string
		code codes.Code
	}{
		{nil, "", codes.Unauthenticated},
		{[]string{"authorization", "Bearer abc"}, "abc", codes.OK},
		{[]string{"authorization", "bearer  abc "}, "abc", codes.OK},
		{[]string{"authorization", "Basic abc"}, "", codes.Unauthenticated},
		{[]string{"authorization", "Bearer "}, "", codes.Unauthenticated},
	} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(tc.md...))
		got, err := BearerToken(ctx)
		if got != tc.want || status.Code(err) != tc.code {
			t.Errorf("%v: got %q %v, want %q %v", tc.md, got, err, tc.want, tc.code)
		}
	}
}

// The fake clientset answers TokenReviews with a reactor (unit scope; the
// real API server's answers are in e2e/integration TestAuthenticatedAgents...).
func reviewing(user authnv1.UserInfo, ok bool, calls *int) *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		*calls++
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		tr.Status = authnv1.TokenReviewStatus{Authenticated: ok, User: user}
		if !ok {
			tr.Status.Error = "token has expired"
		}
		return true, tr, nil
	})
	return c
}

func withToken(tok string) context.Context {
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
}

func TestAgentsNodeFromTokenAndCaching(t *testing.T) {
	calls := 0
	user := authnv1.UserInfo{Username: "system:serviceaccount:vsplane-system:vsplane-agent",
		Extra: map[string]authnv1.ExtraValue{NodeNameExtra: {"node-a"}}}
	a := NewAgents(reviewing(user, true, &calls), "vsplane-system/vsplane-agent")
	for range 3 {
		node, err := a.Node(withToken("t1"))
		if err != nil || node != "node-a" {
			t.Fatalf("Node = %q, %v", node, err)
		}
	}
	if calls != 1 {
		t.Fatalf("%d TokenReviews for one token, want 1 (cached)", calls)
	}

	// A token that expires sooner is cached only until then.
	now := time.Now()
	a.reviewer.now = func() time.Time { return now }
	exp := jwtWithExp(now.Add(time.Minute))
	if _, err := a.Node(withToken(exp)); err != nil {
		t.Fatal(err)
	}
	a.reviewer.now = func() time.Time { return now.Add(2 * time.Minute) }
	before := calls
	_, _ = a.Node(withToken(exp))
	if calls != before+1 {
		t.Fatal("a review was reused past the token's expiry")
	}
}

func TestAgentsRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		user authnv1.UserInfo
		ok   bool
		code codes.Code
	}{
		{"rejected by the API server", authnv1.UserInfo{}, false, codes.Unauthenticated},
		{"another ServiceAccount", authnv1.UserInfo{Username: "system:serviceaccount:default:x",
			Extra: map[string]authnv1.ExtraValue{NodeNameExtra: {"n"}}}, true, codes.PermissionDenied},
		{"a user, not a ServiceAccount", authnv1.UserInfo{Username: "alice"}, true, codes.PermissionDenied},
		{"not bound to a pod", authnv1.UserInfo{Username: "system:serviceaccount:vsplane-system:vsplane-agent"}, true, codes.PermissionDenied},
	} {
		calls := 0
		a := NewAgents(reviewing(tc.user, tc.ok, &calls), "vsplane-system/vsplane-agent")
		if _, err := a.Node(withToken("t")); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}
}

func TestAPIServerErrorsAreUnavailableAndNotCached(t *testing.T) {
	c := fake.NewClientset()
	calls := 0
	c.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		calls++
		return true, nil, errors.New("connection refused")
	})
	r := NewReviewer(c, AgentAudience)
	for range 2 {
		if _, err := r.Review(context.Background(), "t"); status.Code(err) != codes.Unavailable {
			t.Fatalf("got %v, want Unavailable", err)
		}
	}
	if calls != 2 {
		t.Fatalf("%d calls: an API server error must not be cached", calls)
	}
}

func TestCacheIsBounded(t *testing.T) {
	c := newTTLCache[int](3)
	now := time.Now()
	for i := range 5 {
		c.put(hashKey(fmt.Sprint(i)), i, nil, now.Add(time.Duration(i+1)*time.Second))
	}
	if c.Len() != 3 {
		t.Fatalf("cache holds %d entries, want at most 3", c.Len())
	}
	// The entries expiring first went.
	if _, _, ok := c.get(hashKey("0"), now); ok {
		t.Fatal("the earliest-expiring entry was kept")
	}
	if v, _, ok := c.get(hashKey("4"), now); !ok || v != 4 {
		t.Fatal("the newest entry was evicted")
	}
	if _, _, ok := c.get(hashKey("4"), now.Add(time.Hour)); ok {
		t.Fatal("an expired entry was returned")
	}
}

func jwtWithExp(exp time.Time) string {
	claims := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"exp":%d}`, exp.Unix())))
	return "e30." + claims + ".sig"
}
