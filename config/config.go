// Package config loads a pipeline's settings from DEDUPE_* environment
// variables: one set per pipeline, one Deployment per set.
package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Prefix starts every variable name.
const Prefix = "DEDUPE"

// Config is everything a worker needs. The variable of each field is
// DEDUPE_ and its envconfig name.
type Config struct {
	// Pipeline names the pipeline: Redis keys, the default consumer group
	// and metric labels derive from it. Required.
	Pipeline string `envconfig:"PIPELINE" required:"true"`
	// KafkaBrokers are host:port, comma-separated. Required.
	KafkaBrokers []string `envconfig:"KAFKA_BROKERS" required:"true"`
	// InputTopic is read. Required.
	InputTopic string `envconfig:"INPUT_TOPIC" required:"true"`
	// OutputTopic receives first-seen events. Required.
	OutputTopic string `envconfig:"OUTPUT_TOPIC" required:"true"`
	// DLQTopic receives input that cannot be deduplicated. Required.
	DLQTopic string `envconfig:"DLQ_TOPIC" required:"true"`
	// GroupID is the consumer group. Default: dedupe-<pipeline>.
	GroupID string `envconfig:"GROUP_ID"`
	// RedisAddrs are host:port, comma-separated: one is a standalone server,
	// several are seeds of a Redis Cluster. Required.
	RedisAddrs []string `envconfig:"REDIS_ADDRS" required:"true"`
	// IDFrom is where the element ID comes from: json (the JSON fields
	// IDField names), key (the message key), header (the header IDHeader
	// names) or value (a 128-bit hash of the whole value, which catches
	// byte-identical copies). With key, header and value the value is never
	// parsed, so it may be Avro, Protobuf or anything else. Default: json.
	IDFrom string `envconfig:"ID_FROM" default:"json"`
	// IDField, with IDFrom json, is the JSON field path of the ID (click_id,
	// meta.id), or up to 8 paths separated by commas for a composite ID
	// (tenant_id,meta.click_id). The values "key" and "header:NAME" mean
	// IDFrom key and header with IDHeader NAME, as they did before IDFrom.
	// Required with json; not set otherwise.
	IDField string `envconfig:"ID_FIELD"`
	// IDHeader is the header holding the ID, with IDFrom header. Required
	// with header; not set otherwise.
	IDHeader string `envconfig:"ID_HEADER"`
	// TimeField is a JSON field path holding the event time (Unix seconds,
	// Unix milliseconds or RFC 3339), with IDFrom json only. Default:
	// empty, the message timestamp.
	TimeField string `envconfig:"TIME_FIELD"`
	// TimeHeader is a header holding the event time, in the forms of
	// TimeField; not with TimeField. Default: empty, the message timestamp.
	TimeHeader string `envconfig:"TIME_HEADER"`
	// Mode is drop (duplicates are dropped) or shadow (every valid event is
	// forwarded, each deduplicated one with the dedupe-verdict header,
	// first or duplicate, saying what drop would have done, and events
	// beyond the lag bound undeduplicated whatever LatePolicy says). Both
	// decide and record alike, in the same keys, so a pipeline switched
	// from shadow to drop keeps its windows. Default: drop.
	Mode string `envconfig:"MODE" default:"drop"`
	// Window is the deduplication window, a Go duration. Default: 10m.
	Window time.Duration `envconfig:"WINDOW" default:"10m"`
	// WindowMode is rolling or fixed. Default: rolling.
	WindowMode string `envconfig:"WINDOW_MODE" default:"rolling"`
	// MaxLag is the lag bound: events processed up to this long after their
	// event time (a replica behind, every replica down for a while) are
	// deduplicated as if processed live. Filter keys and decision records
	// live this much longer, which costs memory: one more window's filter
	// per window length of MaxLag. Default: 1h; up to 744h.
	MaxLag time.Duration `envconfig:"MAX_LAG" default:"1h"`
	// LatePolicy is what becomes of an event beyond the bound (decided
	// more than MaxLag after the end of its window, or stamped beyond the
	// end of the window after the clock's): forward
	// (undeduplicated, with the dedupe-undeduplicated header) or
	// dead-letter (reason late or future). Default: forward.
	LatePolicy string `envconfig:"LATE_POLICY" default:"forward"`
	// StartOffset is where a new consumer group (one without committed
	// offsets) starts: earliest, latest, an RFC 3339 time, or a duration
	// back from the start of the worker (1h). Default: earliest.
	StartOffset string `envconfig:"START_OFFSET" default:"earliest"`
	// ExpectedPerWindow is the number of distinct IDs per window the filter
	// is sized for. Default: 1000000.
	ExpectedPerWindow int64 `envconfig:"EXPECTED_PER_WINDOW" default:"1000000"`
	// FalsePositiveRate is the chance that a new event is taken for a
	// duplicate (and dropped), at any load up to MaxGrowth times the
	// expected. Default: 1e-6.
	FalsePositiveRate float64 `envconfig:"FALSE_POSITIVE_RATE" default:"1e-6"`
	// MaxGrowth is how far a window may grow past ExpectedPerWindow, as a
	// factor: past it the window only tests new IDs. 1 turns growth off.
	// Default: 64.
	MaxGrowth float64 `envconfig:"MAX_GROWTH" default:"64"`
	// Shards is the least number of keys per window; more spread a window
	// over the masters of a Redis Cluster. Default: 1.
	Shards int `envconfig:"SHARDS" default:"1"`
	// BatchSize is the most events per test-and-set. Default: 1000.
	BatchSize int `envconfig:"BATCH_SIZE" default:"1000"`
	// BatchLinger flushes a partial batch after this long. Default: 100ms.
	BatchLinger time.Duration `envconfig:"BATCH_LINGER" default:"100ms"`
	// HTTPAddr serves /metrics, /healthz and /readyz. Default: :8080.
	HTTPAddr string `envconfig:"HTTP_ADDR" default:":8080"`
	// LogLevel is debug, info, warn or error. Default: info.
	LogLevel string `envconfig:"LOG_LEVEL" default:"info"`
	// RedisTimeout bounds each Redis call. Default: 5s.
	RedisTimeout time.Duration `envconfig:"REDIS_TIMEOUT" default:"5s"`
	// KafkaTimeout bounds each Kafka call. Default: 10s.
	KafkaTimeout time.Duration `envconfig:"KAFKA_TIMEOUT" default:"10s"`
	// KafkaSessionTimeout is the consumer group session timeout: how long
	// a replica that died holds its partitions; the heartbeat interval (a
	// tenth of it) and the rebalance timeout (a quarter, at least 1 s)
	// derive from it (consumer.GroupTimingsFor). Default: 10s.
	KafkaSessionTimeout time.Duration `envconfig:"KAFKA_SESSION_TIMEOUT" default:"10s"`
	// ShutdownTimeout bounds the shutdown after SIGTERM. Default: 30s.
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"30s"`

	// KafkaTLS connects to every broker over TLS. A CA or client
	// certificate file turns it on as well. Default: false.
	KafkaTLS bool `envconfig:"KAFKA_TLS" default:"false"`
	// KafkaTLSCAFile is a PEM file of the CAs the brokers' certificates are
	// checked against. Default: empty, the system's CAs.
	KafkaTLSCAFile string `envconfig:"KAFKA_TLS_CA_FILE"`
	// KafkaTLSCertFile and KafkaTLSKeyFile are a client certificate and its
	// key (PEM), for brokers that ask for one: both or neither.
	KafkaTLSCertFile string `envconfig:"KAFKA_TLS_CERT_FILE"`
	KafkaTLSKeyFile  string `envconfig:"KAFKA_TLS_KEY_FILE"`
	// KafkaSASLMechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. Default:
	// empty, no SASL.
	KafkaSASLMechanism string `envconfig:"KAFKA_SASL_MECHANISM"`
	// KafkaSASLUsername and KafkaSASLPassword: the SASL credentials,
	// required with a mechanism.
	KafkaSASLUsername string `envconfig:"KAFKA_SASL_USERNAME"`
	KafkaSASLPassword Secret `envconfig:"KAFKA_SASL_PASSWORD"`

	// RedisUsername is the Redis ACL user. Default: empty, the default
	// user (a password alone is then AUTH <password>).
	RedisUsername string `envconfig:"REDIS_USERNAME"`
	// RedisPassword is the password of RedisUsername, or of the default
	// user. Default: empty, no AUTH.
	RedisPassword Secret `envconfig:"REDIS_PASSWORD"`
	// RedisTLS connects to every Redis node over TLS. A CA or client
	// certificate file turns it on as well. Default: false.
	RedisTLS bool `envconfig:"REDIS_TLS" default:"false"`
	// RedisTLSCAFile is a PEM file of the CAs Redis certificates are
	// checked against. Default: empty, the system's CAs.
	RedisTLSCAFile string `envconfig:"REDIS_TLS_CA_FILE"`
	// RedisTLSCertFile and RedisTLSKeyFile are a client certificate and its
	// key (PEM), for servers started with tls-auth-clients: both or neither.
	RedisTLSCertFile string `envconfig:"REDIS_TLS_CERT_FILE"`
	RedisTLSKeyFile  string `envconfig:"REDIS_TLS_KEY_FILE"`
	// RedisMinReplicas: when above zero, each test-and-set must reach this
	// many replicas of its master (Redis WAIT) before its verdicts are
	// used. Default: 0.
	RedisMinReplicas int `envconfig:"REDIS_MIN_REPLICAS" default:"0"`
}

// Secret is a configuration value that is never shown: fmt, zap and JSON
// print "[redacted]" in its place ("" when unset). string(s) is the value.
type Secret string

const redacted = "[redacted]"

func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString is for %#v.
func (s Secret) GoString() string { return fmt.Sprintf("config.Secret(%q)", s.String()) }

// MarshalText is for encoders (JSON, zap's reflection).
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// ErrInvalid wraps every configuration error.
var ErrInvalid = errors.New("invalid configuration")

// Load reads the DEDUPE_* variables of the environment and validates them.
// The error is one line naming the variable.
func Load() (Config, error) {
	var c Config
	if err := envconfig.Process(Prefix, &c); err != nil {
		return Config{}, fmt.Errorf("%w: %s", ErrInvalid, oneLine(err))
	}
	// A certificate file turns TLS on; one explicitly turned off beside it
	// is a contradiction, not a choice.
	for _, x := range []struct {
		name       string
		on         bool
		ca, client string
	}{{"KAFKA_TLS", c.KafkaTLS, c.KafkaTLSCAFile, c.KafkaTLSCertFile}, {"REDIS_TLS", c.RedisTLS, c.RedisTLSCAFile, c.RedisTLSCertFile}} {
		if _, set := os.LookupEnv(Prefix + "_" + x.name); set && !x.on && (x.ca != "" || x.client != "") {
			return Config{}, bad(x.name, "false, but %s_%s_CA_FILE or %s_%s_CERT_FILE is set", Prefix, x.name, Prefix, x.name)
		}
	}
	if _, set := os.LookupEnv(Prefix + "_WINDOW_GRACE"); set {
		return Config{}, bad("WINDOW_GRACE", "replaced by %s_MAX_LAG, how long after their event time events are still deduplicated (default 1h); rename it", Prefix)
	}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Defaults is the configuration with every variable at its default and
// the required ones empty. The defaults are the struct tags above, the one
// place they are written: the plan command, the demo and the tests start
// from here.
func Defaults() Config {
	var c Config
	v := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		def, ok := v.Type().Field(i).Tag.Lookup("default")
		if !ok {
			continue
		}
		if err := setText(v.Field(i), def); err != nil {
			panic(fmt.Sprintf("config: default of %s: %v", v.Type().Field(i).Name, err))
		}
	}
	return c
}

// setText sets f from its default tag, for the kinds the tags use.
func setText(f reflect.Value, s string) error {
	if f.Type() == reflect.TypeOf(time.Duration(0)) {
		d, err := time.ParseDuration(s)
		f.SetInt(int64(d))
		return err
	}
	var err error
	switch f.Kind() {
	case reflect.String:
		f.SetString(s)
	case reflect.Bool:
		var b bool
		b, err = strconv.ParseBool(s)
		f.SetBool(b)
	case reflect.Int, reflect.Int64:
		var n int64
		n, err = strconv.ParseInt(s, 10, 64)
		f.SetInt(n)
	case reflect.Float64:
		var x float64
		x, err = strconv.ParseFloat(s, 64)
		f.SetFloat(x)
	default:
		err = fmt.Errorf("no default of kind %s", f.Kind())
	}
	return err
}

func oneLine(err error) string {
	var pe *envconfig.ParseError
	if errors.As(err, &pe) {
		return fmt.Sprintf("%s: cannot read %q as %s", pe.KeyName, pe.Value, pe.TypeName)
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "required key "); ok {
		name, _, _ := strings.Cut(rest, " ")
		return Prefix + "_" + name + ": required, not set"
	}
	return strings.ReplaceAll(msg, "\n", " ")
}

func (c *Config) setDefaults() {
	if c.GroupID == "" {
		c.GroupID = "dedupe-" + c.Pipeline
	}
	c.KafkaSASLMechanism = strings.ToUpper(strings.TrimSpace(c.KafkaSASLMechanism))
	if c.KafkaTLSCAFile != "" || c.KafkaTLSCertFile != "" || c.KafkaTLSKeyFile != "" {
		c.KafkaTLS = true
	}
	if c.RedisTLSCAFile != "" || c.RedisTLSCertFile != "" || c.RedisTLSKeyFile != "" {
		c.RedisTLS = true
	}
}

var (
	// NamePattern is a pipeline's name, and anything else that becomes
	// part of a Redis key or a metric label.
	NamePattern  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)
	topicPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)
)

// VarError is a variable out of range; it wraps ErrInvalid.
type VarError struct {
	Var string // without the prefix: WINDOW
	Msg string
}

func (e *VarError) Error() string {
	return fmt.Sprintf("%v: %s_%s: %s", ErrInvalid, Prefix, e.Var, e.Msg)
}

func (e *VarError) Unwrap() error { return ErrInvalid }

func bad(name, format string, args ...any) error {
	return &VarError{Var: name, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks every field and names the first variable out of range.
func (c Config) Validate() error {
	switch {
	case !NamePattern.MatchString(c.Pipeline):
		return bad("PIPELINE", "%q: want 1 to 100 letters, digits, '.', '_' or '-'", c.Pipeline)
	case len(c.KafkaBrokers) == 0 || hasEmpty(c.KafkaBrokers):
		return bad("KAFKA_BROKERS", "want host:port[,host:port...]")
	case !topicPattern.MatchString(c.InputTopic):
		return bad("INPUT_TOPIC", "%q is not a Kafka topic name", c.InputTopic)
	case !topicPattern.MatchString(c.OutputTopic):
		return bad("OUTPUT_TOPIC", "%q is not a Kafka topic name", c.OutputTopic)
	case !topicPattern.MatchString(c.DLQTopic):
		return bad("DLQ_TOPIC", "%q is not a Kafka topic name", c.DLQTopic)
	case c.OutputTopic == c.InputTopic || c.DLQTopic == c.InputTopic:
		return bad("OUTPUT_TOPIC", "output and dead-letter topics must differ from the input topic %q", c.InputTopic)
	case c.GroupID == "" || len(c.GroupID) > 255:
		return bad("GROUP_ID", "want 1 to 255 characters")
	case len(c.RedisAddrs) == 0 || hasEmpty(c.RedisAddrs):
		return bad("REDIS_ADDRS", "want host:port[,host:port...]")
	case c.Window < time.Second || c.Window%time.Second != 0 || c.Window > 31*24*time.Hour:
		return bad("WINDOW", "%v: want whole seconds from 1s to 744h", c.Window)
	case c.WindowMode != "rolling" && c.WindowMode != "fixed":
		return bad("WINDOW_MODE", "%q: want rolling or fixed", c.WindowMode)
	case c.MaxLag < 0 || c.MaxLag%time.Second != 0 || c.MaxLag > 31*24*time.Hour:
		return bad("MAX_LAG", "%v: want whole seconds from 0 to 744h", c.MaxLag)
	case c.LatePolicy != LateForward && c.LatePolicy != LateDeadLetter:
		return bad("LATE_POLICY", "%q: want %s or %s", c.LatePolicy, LateForward, LateDeadLetter)
	case c.ExpectedPerWindow < 1 || c.ExpectedPerWindow > 1e12:
		return bad("EXPECTED_PER_WINDOW", "%d: want 1 to 1e12", c.ExpectedPerWindow)
	case !(c.FalsePositiveRate >= 1e-12 && c.FalsePositiveRate < 1):
		return bad("FALSE_POSITIVE_RATE", "%g: want at least 1e-12 and less than 1", c.FalsePositiveRate)
	case !(c.MaxGrowth >= 1 && c.MaxGrowth <= 16384):
		return bad("MAX_GROWTH", "%g: want 1 (no growth) to 16384", c.MaxGrowth)
	case c.Shards < 1 || c.Shards > 1024:
		return bad("SHARDS", "%d: want 1 to 1024", c.Shards)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return bad("BATCH_SIZE", "%d: want 1 to 10000", c.BatchSize)
	case c.BatchLinger < time.Millisecond || c.BatchLinger > time.Minute:
		return bad("BATCH_LINGER", "%v: want 1ms to 1m", c.BatchLinger)
	case c.HTTPAddr == "":
		return bad("HTTP_ADDR", "want host:port or :port")
	case c.LogLevel != "debug" && c.LogLevel != "info" && c.LogLevel != "warn" && c.LogLevel != "error":
		return bad("LOG_LEVEL", "%q: want debug, info, warn or error", c.LogLevel)
	case c.RedisTimeout < 10*time.Millisecond || c.RedisTimeout > 5*time.Minute:
		return bad("REDIS_TIMEOUT", "%v: want 10ms to 5m", c.RedisTimeout)
	case c.KafkaTimeout < 100*time.Millisecond || c.KafkaTimeout > 5*time.Minute:
		return bad("KAFKA_TIMEOUT", "%v: want 100ms to 5m", c.KafkaTimeout)
	case c.KafkaSessionTimeout < 500*time.Millisecond || c.KafkaSessionTimeout > 5*time.Minute:
		return bad("KAFKA_SESSION_TIMEOUT", "%v: want 500ms to 5m", c.KafkaSessionTimeout)
	case c.ShutdownTimeout < time.Second || c.ShutdownTimeout > 10*time.Minute:
		return bad("SHUTDOWN_TIMEOUT", "%v: want 1s to 10m", c.ShutdownTimeout)
	case c.RedisMinReplicas < 0 || c.RedisMinReplicas > 5:
		return bad("REDIS_MIN_REPLICAS", "%d: want 0 to 5", c.RedisMinReplicas)
	case c.RedisUsername != "" && c.RedisPassword == "":
		return bad("REDIS_PASSWORD", "required with DEDUPE_REDIS_USERNAME")
	}
	if _, err := c.KafkaSASL(); err != nil {
		return err
	}
	if _, err := c.KafkaTLSConfig(); err != nil {
		return err
	}
	if _, err := c.RedisTLSConfig(); err != nil {
		return err
	}
	if _, err := ParseStartOffset(c.StartOffset); err != nil {
		return bad("START_OFFSET", "%v", err)
	}
	src, err := c.IDSource()
	if err != nil {
		return err
	}
	switch {
	case c.TimeField != "" && c.TimeHeader != "":
		return bad("TIME_FIELD", "set with %s_TIME_HEADER; the event time comes from one of them", Prefix)
	case c.TimeField != "" && src.Kind != JSONID:
		return bad("TIME_FIELD", "reads the JSON value, which %s_ID_FROM=%s never parses; use %s_TIME_HEADER or the message timestamp", Prefix, src.Kind, Prefix)
	case c.TimeField != "":
		if _, err := parsePath(c.TimeField); err != nil {
			return bad("TIME_FIELD", "%v", err)
		}
	}
	if c.TimeHeader != "" {
		if err := checkHeaderName(c.TimeHeader); err != nil {
			return bad("TIME_HEADER", "%v", err)
		}
	}
	if c.Mode != ModeDrop && c.Mode != ModeShadow {
		return bad("MODE", "%q: want %s or %s", c.Mode, ModeDrop, ModeShadow)
	}
	return nil
}

// The values of Mode.
const (
	ModeDrop   = "drop"
	ModeShadow = "shadow"
)

// The values of LatePolicy.
const (
	LateForward    = "forward"
	LateDeadLetter = "dead-letter"
)

// StartOffset is a parsed DEDUPE_START_OFFSET. The zero value is the
// earliest offset.
type StartOffset struct {
	Latest bool
	// At is a point in time, Back a duration before the worker starts.
	At   time.Time
	Back time.Duration
}

// ParseStartOffset reads earliest, latest, an RFC 3339 time or a positive
// duration.
func ParseStartOffset(s string) (StartOffset, error) {
	switch s {
	case "earliest":
		return StartOffset{}, nil
	case "latest":
		return StartOffset{Latest: true}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return StartOffset{At: t}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return StartOffset{Back: d}, nil
	}
	return StartOffset{}, fmt.Errorf("%q: want earliest, latest, an RFC 3339 time or a duration such as 1h", s)
}

// Time is the point in time to start from, given the worker's start now;
// zero for earliest and latest.
func (s StartOffset) Time(now time.Time) time.Time {
	if s.Back > 0 {
		return now.Add(-s.Back)
	}
	return s.At
}

func hasEmpty(xs []string) bool {
	for _, x := range xs {
		if strings.TrimSpace(x) == "" {
			return true
		}
	}
	return false
}

// IDSource says where the element ID of a message is.
type IDSource struct {
	Kind IDKind
	// Header names the header, for HeaderID.
	Header string
	// Paths are the JSON field paths, for JSONID: one, or several for a
	// composite ID.
	Paths [][]string
}

// IDKind is the kind of IDSource: the values of DEDUPE_ID_FROM.
type IDKind int

const (
	JSONID IDKind = iota
	KeyID
	HeaderID
	ValueID
)

var idKinds = [...]string{"json", "key", "header", "value"}

// String is the DEDUPE_ID_FROM value of k.
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

// IDSource reads DEDUPE_ID_FROM, DEDUPE_ID_FIELD and DEDUPE_ID_HEADER.
// The error is a *VarError naming the variable at fault.
func (c Config) IDSource() (IDSource, error) {
	return ParseIDSource(c.IDFrom, c.IDField, c.IDHeader)
}

// ParseIDSource reads the values of DEDUPE_ID_FROM, DEDUPE_ID_FIELD and
// DEDUPE_ID_HEADER. With from json (or empty), field "key" and
// "header:NAME" are the forms DEDUPE_ID_FIELD had before DEDUPE_ID_FROM:
// the message key and header NAME. The error is a *VarError.
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
			if err := checkHeaderName(name); err != nil {
				return IDSource{}, bad("ID_FIELD", "header:NAME: %v", err)
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
	if kind < 0 {
		return IDSource{}, bad("ID_FROM", "%q: want json, key, header or value", from)
	}
	if header != "" && kind != HeaderID {
		return IDSource{}, bad("ID_HEADER", "set, but %s_ID_FROM=%s does not read a header; unset it or set %s_ID_FROM=header", Prefix, kind, Prefix)
	}
	if field != "" && kind != JSONID {
		return IDSource{}, bad("ID_FIELD", "set, but %s_ID_FROM=%s does not read JSON fields; unset it or set %s_ID_FROM=json", Prefix, kind, Prefix)
	}
	switch kind {
	case HeaderID:
		if err := checkHeaderName(header); err != nil {
			return IDSource{}, bad("ID_HEADER", "%v (required with %s_ID_FROM=header)", err, Prefix)
		}
		return IDSource{Kind: HeaderID, Header: header}, nil
	case JSONID:
		if field == "" {
			return IDSource{}, bad("ID_FIELD", "required with %s_ID_FROM=json: a JSON field path such as click_id or meta.id, or several separated by commas", Prefix)
		}
		parts := strings.Split(field, ",")
		if len(parts) > MaxIDParts {
			return IDSource{}, bad("ID_FIELD", "%d fields: want at most %d", len(parts), MaxIDParts)
		}
		src := IDSource{Kind: JSONID}
		seen := map[string]bool{}
		for _, part := range parts {
			part = strings.TrimSpace(part)
			p, err := parsePath(part)
			if err != nil {
				return IDSource{}, bad("ID_FIELD", "%v", err)
			}
			if seen[part] {
				return IDSource{}, bad("ID_FIELD", "%q is listed twice", part)
			}
			seen[part] = true
			src.Paths = append(src.Paths, p)
		}
		return src, nil
	}
	return IDSource{Kind: kind}, nil
}

// checkHeaderName accepts a Kafka header name the worker can look up.
func checkHeaderName(name string) error {
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

func parsePath(s string) ([]string, error) {
	if s == "" {
		return nil, errors.New("empty; want a JSON field path such as click_id or meta.id")
	}
	parts := strings.Split(s, ".")
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("%q has an empty path element", s)
		}
	}
	if len(parts) > 16 {
		return nil, fmt.Errorf("%q is deeper than 16 fields", s)
	}
	return parts, nil
}
