package consumer

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseIDSource(t *testing.T) {
	for _, tc := range []struct {
		from, field, header string
		want                IDSource
		says                string
	}{
		{"json", "click_id", "", IDSource{Kind: JSONID, Paths: [][]string{{"click_id"}}}, "JSON field click_id"},
		{"", "meta.id", "", IDSource{Kind: JSONID, Paths: [][]string{{"meta", "id"}}}, "JSON field meta.id"},
		{"json", "tenant_id, meta.click_id", "", IDSource{Kind: JSONID, Paths: [][]string{{"tenant_id"}, {"meta", "click_id"}}},
			"composite of JSON fields tenant_id, meta.click_id"},
		{"key", "", "", IDSource{Kind: KeyID}, "the message key"},
		{"header", "", "x-id", IDSource{Kind: HeaderID, Header: "x-id"}, `header "x-id"`},
		{"value", "", "", IDSource{Kind: ValueID}, "a 128-bit hash of the value"},
		// The forms field had before from existed.
		{"json", "key", "", IDSource{Kind: KeyID}, "the message key"},
		{"", "header:x-id", "", IDSource{Kind: HeaderID, Header: "x-id"}, `header "x-id"`},
	} {
		got, err := ParseIDSource(tc.from, tc.field, tc.header)
		if err != nil || !reflect.DeepEqual(got, tc.want) || got.String() != tc.says {
			t.Errorf("ParseIDSource(%q, %q, %q) = %+v (%s), %v; want %+v (%s)", tc.from, tc.field, tc.header, got, got, err, tc.want, tc.says)
		}
		if got.Composite() != (len(tc.want.Paths) > 1) {
			t.Errorf("%q: composite %v", tc.field, got.Composite())
		}
	}
}

// Each wrong input is named, with the source it is wrong for, so that a
// caller can name its own variable.
func TestParseIDSourceSaysWhichInput(t *testing.T) {
	for _, tc := range []struct {
		from, field, header string
		input               IDInput
		kind                IDKind
		cause               error // ErrNotRead, ErrRequired, or nil for another
	}{
		{"bytes", "", "", IDFrom, -1, nil},
		{"Key", "", "", IDFrom, -1, nil},
		{"key", "click_id", "", IDField, KeyID, ErrNotRead},
		{"value", "click_id", "", IDField, ValueID, ErrNotRead},
		{"json", "click_id", "x-id", IDHeader, JSONID, ErrNotRead},
		{"key", "", "x-id", IDHeader, KeyID, ErrNotRead},
		{"json", "", "", IDField, JSONID, ErrRequired},
		{"header", "", "", IDHeader, HeaderID, nil},
		{"header", "", " x-id", IDHeader, HeaderID, nil},
		{"json", "header:", "", IDField, HeaderID, nil},
		{"json", "meta..id", "", IDField, JSONID, nil},
		{"json", "a,,b", "", IDField, JSONID, nil},
		{"json", "a,b,a", "", IDField, JSONID, nil},
		{"json", "a,b,c,d,e,f,g,h,i", "", IDField, JSONID, nil},
		{"json", strings.Repeat("a.", MaxPathFields) + "a", "", IDField, JSONID, nil},
	} {
		_, err := ParseIDSource(tc.from, tc.field, tc.header)
		se, ok := errors.AsType[*IDSourceError](err)
		switch {
		case !ok:
			t.Errorf("ParseIDSource(%q, %q, %q): %v, want an *IDSourceError", tc.from, tc.field, tc.header, err)
		case se.Input != tc.input || se.Kind != tc.kind:
			t.Errorf("ParseIDSource(%q, %q, %q): %v: input %v, kind %v; want %v, %v", tc.from, tc.field, tc.header, err, se.Input, se.Kind, tc.input, tc.kind)
		case tc.cause != nil && !errors.Is(err, tc.cause):
			t.Errorf("ParseIDSource(%q, %q, %q): %v; want %v inside", tc.from, tc.field, tc.header, err, tc.cause)
		case tc.cause == nil && (errors.Is(err, ErrNotRead) || errors.Is(err, ErrRequired)):
			t.Errorf("ParseIDSource(%q, %q, %q): %v; want a cause of its own", tc.from, tc.field, tc.header, err)
		case !strings.HasPrefix(err.Error(), "ID "+tc.input.String()+": "):
			t.Errorf("ParseIDSource(%q, %q, %q): %q does not start with the input's name", tc.from, tc.field, tc.header, err)
		}
	}
}

// A path is split at its dots, each field taken literally; the ID's
// fields and the event time's are read alike.
func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"click_id", []string{"click_id"}},
		{"meta.id", []string{"meta", "id"}},
		{"a*b.c?d", []string{"a*b", "c?d"}},
		{strings.Repeat("a.", MaxPathFields-1) + "a", strings.Split(strings.Repeat("a.", MaxPathFields-1)+"a", ".")},
	} {
		if got, err := ParsePath(tc.in); err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParsePath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", ".", "a.", ".a", "a..b", strings.Repeat("a.", MaxPathFields) + "a"} {
		if got, err := ParsePath(bad); err == nil {
			t.Errorf("ParsePath(%q) = %q, no error", bad, got)
		}
	}
}
