package config

import (
	"errors"

	"dedupe-worker/internal/consumer"
)

// IDSource reads DEDUPE_ID_FROM, DEDUPE_ID_FIELD and DEDUPE_ID_HEADER.
// The error is a *VarError naming the variable at fault.
func (c Config) IDSource() (consumer.IDSource, error) {
	return ParseIDSource(c.IDFrom, c.IDField, c.IDHeader)
}

// Extractor is the worker's reader of each event's ID and event time
// (consumer.NewExtractor): DEDUPE_ID_FROM, DEDUPE_ID_FIELD,
// DEDUPE_ID_HEADER, DEDUPE_TIME_FIELD and DEDUPE_TIME_HEADER, checked as
// the worker checks them. The error is a *VarError naming the variable at
// fault; Load refuses a Config whose extractor fails, so a loaded
// Config's never does.
func (c Config) Extractor() (*consumer.Extractor, error) {
	src, err := c.IDSource()
	if err != nil {
		return nil, err
	}
	if c.TimeHeader != "" {
		if err := consumer.CheckHeaderName(c.TimeHeader); err != nil {
			return nil, bad("TIME_HEADER", "%v", err)
		}
	}
	ex, err := consumer.NewExtractor(src, c.TimeField, c.TimeHeader)
	if err != nil {
		// The source is one ParseIDSource made and the header's name is
		// checked: what is left to refuse is the time field, malformed,
		// beside a time header, or with a source that leaves the value
		// unparsed.
		return nil, bad("TIME_FIELD", "%v", err)
	}
	return ex, nil
}

// ParseIDSource reads the values of DEDUPE_ID_FROM, DEDUPE_ID_FIELD and
// DEDUPE_ID_HEADER as consumer.ParseIDSource does (with from json, field
// "key" and "header:NAME" are the forms DEDUPE_ID_FIELD had before
// DEDUPE_ID_FROM). The error is a *VarError naming the variable of the
// input at fault.
func ParseIDSource(from, field, header string) (consumer.IDSource, error) {
	src, err := consumer.ParseIDSource(from, field, header)
	if err != nil {
		return consumer.IDSource{}, idSourceVarError(err)
	}
	return src, nil
}

// idVars are the variables of consumer.ParseIDSource's inputs.
var idVars = [...]string{consumer.IDFrom: "ID_FROM", consumer.IDField: "ID_FIELD", consumer.IDHeader: "ID_HEADER"}

// idReaders say, for an input a source may not read, what it holds and
// the DEDUPE_ID_FROM that reads it.
var idReaders = map[consumer.IDInput]struct {
	holds  string
	reader consumer.IDKind
}{
	consumer.IDField:  {"JSON fields", consumer.JSONID},
	consumer.IDHeader: {"a header", consumer.HeaderID},
}

// idSourceVarError is the *VarError of an error of
// consumer.ParseIDSource: the variable of the input at fault, and what to
// set instead.
func idSourceVarError(err error) error {
	se, ok := errors.AsType[*consumer.IDSourceError](err)
	if !ok || se.Input < 0 || int(se.Input) >= len(idVars) {
		return bad("ID_FROM", "%v", err)
	}
	name := idVars[se.Input]
	switch r, reads := idReaders[se.Input]; {
	case errors.Is(se.Err, consumer.ErrNotRead) && reads:
		return bad(name, "set, but %s_ID_FROM=%s does not read %s; unset it or set %s_ID_FROM=%s", Prefix, se.Kind, r.holds, Prefix, r.reader)
	case errors.Is(se.Err, consumer.ErrRequired):
		return bad(name, "required with %s_ID_FROM=%s: a JSON field path such as click_id or meta.id, or several separated by commas", Prefix, se.Kind)
	case se.Input == consumer.IDHeader:
		return bad(name, "%v (required with %s_ID_FROM=%s)", se.Err, Prefix, se.Kind)
	}
	return bad(name, "%v", se.Err)
}
