package cluster

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

const sampleIPVSADM = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  198.18.0.10:80 rr
  -> 198.19.2.11:8080             Masq    1      0          3
  -> 198.19.1.11:8080             Masq    0      0          7
UDP  198.18.0.10:80 rr
  -> 198.19.1.11:8080             Masq    1      0          0
TCP  198.18.0.20:443 rr persistent 10800
`

func TestParseIPVSADM(t *testing.T) {
	got, err := ParseIPVSADM(sampleIPVSADM)
	if err != nil {
		t.Fatal(err)
	}
	want := IPVSTable{
		"TCP 198.18.0.10:80 rr":                   {"198.19.1.11:8080 w=0", "198.19.2.11:8080 w=1"},
		"UDP 198.18.0.10:80 rr":                   {"198.19.1.11:8080 w=1"},
		"TCP 198.18.0.20:443 rr persistent 10800": {},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("parse (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.19.2.11:8080"}, got.Serving("TCP 198.18.0.10:80 rr")); d != "" {
		t.Errorf("Serving (-want +got):\n%s", d)
	}
	if n := len(got.Find("198.18.0.10", 80)); n != 2 {
		t.Errorf("Find: %d virtual servers, want 2", n)
	}
	if n := len(got.Find("198.18.0.1", 80)); n != 0 {
		t.Errorf("Find matched a prefix of the address: %d", n)
	}
	if d := cmp.Diff([]string{"198.19.2.11:8080 w=1"}, got.WithoutDraining()["TCP 198.18.0.10:80 rr"]); d != "" {
		t.Errorf("WithoutDraining (-want +got):\n%s", d)
	}
}

func TestParseIPVSADMBadInput(t *testing.T) {
	for _, in := range []string{"  -> 1.2.3.4:80 Masq 1 0 0\n", "garbage here\n", "TCP 1.2.3.4:80\n"} {
		if _, err := ParseIPVSADM(in); err == nil {
			t.Errorf("ParseIPVSADM(%q): no error", in)
		}
	}
}

func TestParseHTTPResponse(t *testing.T) {
	raw := "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nX-Load-Balancing-Endpoint-Weight: 0\r\n\r\n{\"localEndpoints\": 0}"
	r, err := ParseHTTPResponse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != 503 || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("X-Load-Balancing-Endpoint-Weight") != "0" || r.Body != `{"localEndpoints": 0}` {
		t.Fatalf("parsed %+v", r)
	}
	for _, bad := range []string{"", "garbage\r\n\r\n", "HTTP/1.1 abc\r\n\r\n"} {
		if _, err := ParseHTTPResponse(bad); err == nil {
			t.Errorf("ParseHTTPResponse(%q): no error", bad)
		}
	}
}
