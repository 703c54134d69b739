package configfile_test

import (
	"encoding/json"
	"errors"
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/internal/configfile"
)

var (
	widget = configfile.Type{APIVersion: "test.vsplane.io/v1", Kind: "Widget"}
	legacy = configfile.Type{APIVersion: "legacy.example/v1", Kind: "OldWidget"}
)

type inner struct {
	Name  string          `json:"name"`
	Every metav1.Duration `json:"every"`
}

type widgetConfig struct {
	metav1.TypeMeta `json:",inline"`
	Size            int      `json:"size"`
	Tags            []string `json:"tags"`
	Inner           inner    `json:"inner"`
	Items           []inner  `json:"items"`
	Ptr             *inner   `json:"ptr"`
	Skipped         string   `json:"-"`
	untagged        int
	NoTag           bool
}

func TestReadTypes(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"empty", "", "empty file: want apiVersion test.vsplane.io/v1, kind Widget"},
		{"null", "null\n", "empty file: want apiVersion test.vsplane.io/v1, kind Widget"},
		{"comments only", "# nothing\n", "empty file"},
		{"not yaml", "apiVersion: [", "not a YAML or JSON document"},
		{"duplicate key", "kind: Widget\nkind: Widget\n", "not a YAML or JSON document"},
		{"not an object", "- a\n- b\n", "not a configuration object"},
		{"missing type", "size: 1\n", "apiVersion and kind missing: want apiVersion test.vsplane.io/v1, kind Widget (or legacy.example/v1, OldWidget)"},
		{"wrong kind", "apiVersion: test.vsplane.io/v1\nkind: Gadget\n", `apiVersion "test.vsplane.io/v1", kind "Gadget": not supported; want apiVersion test.vsplane.io/v1, kind Widget (or legacy.example/v1, OldWidget)`},
		{"wrong version", "apiVersion: test.vsplane.io/v2\nkind: Widget\n", `apiVersion "test.vsplane.io/v2", kind "Widget": not supported`},
		{"kind only", "kind: Widget\n", `apiVersion "", kind "Widget": not supported`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := configfile.Read([]byte(tc.doc), widget, legacy)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	var te *configfile.TypeError
	_, err := configfile.Read([]byte("apiVersion: a/v1\nkind: B\n"), widget)
	if !errors.As(err, &te) || te.Got != (configfile.Type{APIVersion: "a/v1", Kind: "B"}) || len(te.Want) != 1 || te.Want[0] != widget {
		t.Errorf("TypeError: got %#v (%v)", te, err)
	}
	for _, doc := range []string{"apiVersion: legacy.example/v1\nkind: OldWidget\n", `{"apiVersion":"legacy.example/v1","kind":"OldWidget"}`} {
		d, err := configfile.Read([]byte(doc), widget, legacy)
		if err != nil || d.Type != legacy || !strings.Contains(string(d.JSON), `"kind":"OldWidget"`) {
			t.Errorf("%q: got %+v, %v", doc, d, err)
		}
	}
}

func TestDecodeStrict(t *testing.T) {
	defaults := func() widgetConfig {
		return widgetConfig{Size: 3, Tags: []string{"x"}, Inner: inner{Name: "n", Every: metav1.Duration{Duration: time.Second}}}
	}
	// Fields left out keep their defaults; a list given replaces the default.
	c := defaults()
	doc, err := configfile.Read([]byte("apiVersion: test.vsplane.io/v1\nkind: Widget\ninner: {every: 1m}\ntags: [a, b]\nitems: [{name: i}]\nNoTag: true\n"), widget)
	if err != nil {
		t.Fatal(err)
	}
	if err := configfile.DecodeStrict(doc.JSON, &c); err != nil {
		t.Fatal(err)
	}
	want := defaults()
	want.TypeMeta = metav1.TypeMeta{APIVersion: widget.APIVersion, Kind: widget.Kind}
	want.Inner.Every.Duration, want.Tags, want.Items, want.NoTag = time.Minute, []string{"a", "b"}, []inner{{Name: "i"}}, true
	if diff := cmp.Diff(want, c, cmp.AllowUnexported(widgetConfig{})); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}

	for _, tc := range []struct{ name, doc, want string }{
		{"top level", `{"sise": 1}`, `unknown field "sise"`},
		{"nested", `{"inner": {"nmae": "x"}}`, `unknown field "inner.nmae"`},
		{"wrong case", `{"Size": 1}`, `unknown field "Size"`},
		{"in a list", `{"items": [{"name": "a"}, {"every": "1s", "nmae": "b"}]}`, `unknown field "items[1].nmae"`},
		{"through a pointer", `{"ptr": {"x": 1}}`, `unknown field "ptr.x"`},
		{"all at once, sorted", `{"zz": 1, "inner": {"b": 1, "a": 2}}`, `unknown field "inner.a", "inner.b", "zz"`},
		{"json:\"-\" is no field", `{"Skipped": "x"}`, `unknown field "Skipped"`},
		{"unexported is no field", `{"untagged": 1}`, `unknown field "untagged"`},
		{"bad duration", `{"inner": {"every": "soon"}}`, `"soon"`},
		{"wrong type", `{"size": "big"}`, "size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := defaults()
			err := configfile.DecodeStrict([]byte(tc.doc), &c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	var ue *configfile.UnknownFieldError
	if err := configfile.DecodeStrict([]byte(`{"a":1,"b":{}}`), &c); !errors.As(err, &ue) || strings.Join(ue.Paths, ",") != "a,b" {
		t.Errorf("UnknownFieldError: %v", err)
	}
	if err := configfile.DecodeStrict([]byte(`{}`), c); err == nil {
		t.Error("a non-pointer was accepted")
	}
	// Inlined fields (TypeMeta) are known; leaves with their own decoding
	// (metav1.Duration) are not walked into.
	if got := configfile.UnknownFields([]byte(`{"apiVersion":"a","kind":"b","inner":{"every":{"x":1}}}`), reflect.TypeFor[widgetConfig]()); len(got) != 0 {
		t.Errorf("UnknownFields = %v", got)
	}
}

func TestProblems(t *testing.T) {
	var p configfile.Problems
	if p.Err() != nil {
		t.Fatal("empty Problems is an error")
	}
	p.Add("a.b", "x", "must be %s", "y")
	p.Add("c", -time.Second, "must be >= 0")
	p.Add("d", 32, "must be 1..31")
	p.Add("e", []string{}, "must not be empty")
	p.Add("f", []string{"h:1", "i"}, "bad")
	p.Add("g", 0.5, "too small")
	want := "a.b \"x\": must be y\nc \"-1s\": must be >= 0\nd 32: must be 1..31\ne []: must not be empty\nf [\"h:1\", \"i\"]: bad\ng 0.5: too small"
	if got := p.Err().Error(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestOverlayAndExplicit(t *testing.T) {
	type conf struct {
		Name string
		List []string
		Bit  int32
		Wait time.Duration
	}
	bind := func(fs *flag.FlagSet, c *conf) {
		fs.StringVar(&c.Name, "name", c.Name, "")
		fs.Var((*configfile.ListValue)(&c.List), "list", "")
		fs.Var((*configfile.Int32Value)(&c.Bit), "bit", "")
		fs.DurationVar(&c.Wait, "wait", c.Wait, "")
	}
	defaults := conf{Name: "d", List: []string{"a"}, Bit: 14, Wait: time.Second}
	parse := func(args ...string) *flag.FlagSet {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		c := defaults
		bind(fs, &c)
		fs.Bool("other", false, "a flag the file does not hold")
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	file := conf{Name: "file", List: []string{"f1", "f2"}, Bit: 3, Wait: time.Minute}

	// Flags not given leave the file's values, even where the file differs
	// from the flag's default; given ones win, even at the default value.
	got := file
	fs := parse("--list=", "--bit=14", "--other")
	if err := configfile.Overlay(fs, func(b *flag.FlagSet) { bind(b, &got) }); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(conf{Name: "file", Bit: 14, Wait: time.Minute}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if e := configfile.Explicit(fs, func(b *flag.FlagSet) { c := defaults; bind(b, &c) }); strings.Join(e, ",") != "bit,list" {
		t.Errorf("Explicit = %v", e)
	}
	got = file
	if err := configfile.Overlay(parse("--list= x, ,y ", "--wait=90s", "--name=n"), func(b *flag.FlagSet) { bind(b, &got) }); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(conf{Name: "n", List: []string{"x", "y"}, Bit: 3, Wait: 90 * time.Second}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// A value the target rejects names the flag.
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("bit", "", "")
	_ = fs.Parse([]string{"--bit=99999999999"})
	if err := configfile.Overlay(fs, func(b *flag.FlagSet) { bind(b, &got) }); err == nil || !strings.HasPrefix(err.Error(), "--bit: ") {
		t.Errorf("got %v", err)
	}
}

// TestDurationAndTypeMetaAreMetav1JSON: the agent's own Duration and
// TypeMeta read and write the JSON of Kubernetes' metav1 types, so files
// written for either decode the same.
func TestDurationAndTypeMetaAreMetav1JSON(t *testing.T) {
	for _, in := range []string{`"30s"`, `"1h2m3.5s"`, `"0s"`, `"-5ms"`, `"x"`, `30`, `null`, `""`} {
		var ours configfile.Duration
		var theirs metav1.Duration
		errOurs, errTheirs := json.Unmarshal([]byte(in), &ours), json.Unmarshal([]byte(in), &theirs)
		if (errOurs == nil) != (errTheirs == nil) || ours.Duration != theirs.Duration {
			t.Errorf("decode %s: ours %v, %v; metav1 %v, %v", in, ours.Duration, errOurs, theirs.Duration, errTheirs)
		}
		if errOurs != nil {
			continue
		}
		a, _ := json.Marshal(ours)
		b, _ := json.Marshal(theirs)
		if string(a) != string(b) {
			t.Errorf("encode %s: ours %s, metav1 %s", in, a, b)
		}
	}
	doc := []byte(`{"apiVersion":"config.vsplane.io/v1alpha1","kind":"X","every":"5s"}`)
	var ours struct {
		configfile.TypeMeta `json:",inline"`
		Every               configfile.Duration `json:"every"`
	}
	var theirs struct {
		metav1.TypeMeta `json:",inline"`
		Every           metav1.Duration `json:"every"`
	}
	if err := json.Unmarshal(doc, &ours); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(doc, &theirs); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(ours)
	b, _ := json.Marshal(theirs)
	if string(a) != string(b) || ours.APIVersion != theirs.APIVersion || ours.Kind != theirs.Kind {
		t.Errorf("document: ours %s, metav1 %s", a, b)
	}
	if u := configfile.UnknownFields(doc, reflect.TypeOf(ours)); len(u) != 0 {
		t.Errorf("unknown fields %v: the embedded TypeMeta's keys must be known", u)
	}
}
