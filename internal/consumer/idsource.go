package consumer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// IDSource says where the element ID of a message is.
type IDSource struct {
	Kind IDKind
	// Header names the header, for HeaderID.
	Header string
	// Paths are the JSON field paths, for JSONID: one, or up to MaxIDParts
	// for a composite ID.
	Paths [][]string
}

// IDKind is the kind of IDSource.
type IDKind int

// The kinds of IDSource.
const (
	// JSONID: one JSON field of the value, or a composite of several.
	JSONID IDKind = iota
	// KeyID: the message key.
	KeyID
	// HeaderID: a header of the message.
	HeaderID
	// ValueID: a 128-bit hash of the whole value (AppendValueID).
	ValueID
)

var idKinds = [...]string{JSONID: "json", KeyID: "key", HeaderID: "header", ValueID: "value"}

// String is the name ParseIDSource reads for k: json, key, header or
// value.
func (k IDKind) String() string {
	if int(k) < len(idKinds) && k >= 0 {
		return idKinds[k]
	}
	return "unknown"
}

// MaxIDParts bounds the fields of a composite ID.
const MaxIDParts = 8

// Composite reports whether the ID is made of several JSON fields.
func (s IDSource) Composite() bool { return s.Kind == JSONID && len(s.Paths) > 1 }

// String says where the ID is, in words: for logs and the plan command.
func (s IDSource) String() string {
	switch s.Kind {
	case KeyID:
		return "the message key"
	case HeaderID:
		return "header " + strconv.Quote(s.Header)
	case ValueID:
		return "a 128-bit hash of the value"
	}
	names := make([]string, len(s.Paths))
	for i, p := range s.Paths {
		names[i] = strings.Join(p, ".")
	}
	if len(names) == 1 {
		return "JSON field " + names[0]
	}
	return "composite of JSON fields " + strings.Join(names, ", ")
}

// IDInput names an input of ParseIDSource.
type IDInput int

// The inputs of ParseIDSource.
const (
	IDFrom IDInput = iota
	IDField
	IDHeader
)

var idInputs = [...]string{IDFrom: "from", IDField: "field", IDHeader: "header"}

// String is the input's parameter name: from, field or header.
func (in IDInput) String() string {
	if int(in) < len(idInputs) && in >= 0 {
		return idInputs[in]
	}
	return "unknown"
}

// IDSourceError is an input of ParseIDSource that is wrong. Its text
// names the input by its parameter; a caller that reads the inputs from
// elsewhere (variables, flags) names them its own way from Input, Kind
// and Err.
type IDSourceError struct {
	// Input is the input at fault.
	Input IDInput
	// Kind is the source that from asks for, when the input is wrong for
	// it: set though Kind does not read it (Err is ErrNotRead), or needed
	// by it and missing (ErrRequired) or malformed.
	Kind IDKind
	Err  error
}

func (e *IDSourceError) Error() string {
	if errors.Is(e.Err, ErrNotRead) || errors.Is(e.Err, ErrRequired) {
		return fmt.Sprintf("ID %s: %v (from %s)", e.Input, e.Err, e.Kind)
	}
	return fmt.Sprintf("ID %s: %v", e.Input, e.Err)
}

func (e *IDSourceError) Unwrap() error { return e.Err }

// The causes of an IDSourceError that depend on the source: an input the
// source does not read, one it needs.
var (
	ErrNotRead  = errors.New("set, but the ID source does not read it")
	ErrRequired = errors.New("required by the ID source")
)

// idSourceError is the *IDSourceError of input in for kind.
func idSourceError(in IDInput, kind IDKind, format string, args ...any) error {
	return &IDSourceError{Input: in, Kind: kind, Err: fmt.Errorf(format, args...)}
}

// ParseIDSource reads where the ID is: from is json (or empty), key,
// header or value; field the JSON field path with json (or several,
// separated by commas, for a composite ID); header the header's name with
// header. With from json, field "key" and "header:NAME" are the forms
// field had before from existed: the message key and header NAME. The
// error is an *IDSourceError.
func ParseIDSource(from, field, header string) (IDSource, error) {
	if from == "" {
		from = JSONID.String()
	}
	if from == JSONID.String() {
		switch {
		case field == "key" && header == "":
			return IDSource{Kind: KeyID}, nil
		case strings.HasPrefix(field, "header:") && header == "":
			name := strings.TrimPrefix(field, "header:")
			if err := CheckHeaderName(name); err != nil {
				return IDSource{}, idSourceError(IDField, HeaderID, "header:NAME: %w", err)
			}
			return IDSource{Kind: HeaderID, Header: name}, nil
		}
	}
	kind := IDKind(-1)
	for i, k := range idKinds {
		if from == k {
			kind = IDKind(i)
		}
	}
	switch {
	case kind < 0:
		return IDSource{}, idSourceError(IDFrom, kind, "%q: want json, key, header or value", from)
	case header != "" && kind != HeaderID:
		return IDSource{}, &IDSourceError{Input: IDHeader, Kind: kind, Err: ErrNotRead}
	case field != "" && kind != JSONID:
		return IDSource{}, &IDSourceError{Input: IDField, Kind: kind, Err: ErrNotRead}
	}
	switch kind {
	case HeaderID:
		if err := CheckHeaderName(header); err != nil {
			return IDSource{}, idSourceError(IDHeader, kind, "%w", err)
		}
		return IDSource{Kind: HeaderID, Header: header}, nil
	case JSONID:
		return parseJSONSource(field)
	}
	return IDSource{Kind: kind}, nil
}

// parseJSONSource reads the field paths of a JSON source: one, or up to
// MaxIDParts separated by commas, each listed once.
func parseJSONSource(field string) (IDSource, error) {
	if field == "" {
		return IDSource{}, &IDSourceError{Input: IDField, Kind: JSONID, Err: ErrRequired}
	}
	parts := strings.Split(field, ",")
	if len(parts) > MaxIDParts {
		return IDSource{}, idSourceError(IDField, JSONID, "%d fields: want at most %d", len(parts), MaxIDParts)
	}
	src := IDSource{Kind: JSONID}
	seen := map[string]bool{}
	for _, part := range parts {
		part = strings.TrimSpace(part)
		p, err := ParsePath(part)
		if err != nil {
			return IDSource{}, idSourceError(IDField, JSONID, "%w", err)
		}
		if seen[part] {
			return IDSource{}, idSourceError(IDField, JSONID, "%q is listed twice", part)
		}
		seen[part] = true
		src.Paths = append(src.Paths, p)
	}
	return src, nil
}

// MaxPathFields bounds the depth of a JSON field path.
const MaxPathFields = 16

// ParsePath splits a JSON field path (click_id, meta.id) into its field
// names, taken literally: the one reading of a path, for the ID's fields
// and the event time's. The error says what is wrong: empty, an empty
// field name, or deeper than MaxPathFields.
func ParsePath(s string) ([]string, error) {
	if s == "" {
		return nil, errors.New("empty; want a JSON field path such as click_id or meta.id")
	}
	parts := strings.Split(s, ".")
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("%q has an empty path element", s)
		}
	}
	if len(parts) > MaxPathFields {
		return nil, fmt.Errorf("%q is deeper than %d fields", s, MaxPathFields)
	}
	return parts, nil
}

// CheckHeaderName accepts a Kafka header name the worker can look up: of
// 1 to 255 bytes, without a space at either end.
func CheckHeaderName(name string) error {
	switch {
	case name == "":
		return errors.New("empty; want a header name")
	case len(name) > 255:
		return fmt.Errorf("%d bytes: want a header name of at most 255", len(name))
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("%q starts or ends with a space", name)
	}
	return nil
}
