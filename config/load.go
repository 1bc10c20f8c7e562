package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Load reads the DEDUPE_* variables of the environment and validates them.
// A DEDUPE_ variable that names no setting stops it (CheckUnknown). The
// error is one line naming the variable. It starts from Defaults: a
// variable not set leaves a field without a default tag at the library's
// default (envconfig sets only the fields with a variable or a tag).
func Load() (Config, error) {
	c, err := load(true)
	if err != nil {
		return Config{}, err
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
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// LoadSizing reads the DEDUPE_* variables as Load does, none of them
// required, and validates those the filter is sized from
// (ValidateSizing): the settings of dedupe-worker plan, which sizes a
// pipeline's filter without connecting to it.
func LoadSizing() (Config, error) {
	c, err := load(false)
	if err != nil {
		return Config{}, err
	}
	if err := c.ValidateSizing(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// load reads the variables onto Defaults, refusing one that names no
// setting or one renamed; with required false, a required variable not
// set leaves its field empty.
func load(required bool) (Config, error) {
	if err := CheckUnknown(os.Environ()); err != nil {
		return Config{}, err
	}
	c := Defaults()
	if err := process(&c, required); err != nil {
		return Config{}, fmt.Errorf("%w: %s", ErrInvalid, oneLine(err))
	}
	if _, set := os.LookupEnv(Prefix + "_WINDOW_GRACE"); set {
		return Config{}, bad("WINDOW_GRACE", "replaced by %s_MAX_LAG, how long after their event time events are still deduplicated (default 1h); rename it", Prefix)
	}
	return c, nil
}

// process is envconfig.Process of the variables onto c. Without required
// it reads them into a Config whose type has no required tags, which
// converts to and from Config (conversion ignores tags): the same reader,
// the same names and the same parsing, with nothing required.
func process(c *Config, required bool) error {
	if required {
		return envconfig.Process(Prefix, c)
	}
	v := reflect.New(optional)
	v.Elem().Set(reflect.ValueOf(*c).Convert(optional))
	if err := envconfig.Process(Prefix, v.Interface()); err != nil {
		return err
	}
	*c = v.Elem().Convert(reflect.TypeFor[Config]()).Interface().(Config)
	return nil
}

// optional is Config's type without its required tags.
var optional = func() reflect.Type {
	typ := reflect.TypeFor[Config]()
	fields := make([]reflect.StructField, typ.NumField())
	for i := range fields {
		f := typ.Field(i)
		f.Tag = reflect.StructTag(strings.Replace(string(f.Tag), ` required:"true"`, "", 1))
		fields[i] = f
	}
	return reflect.StructOf(fields)
}()

// tagDefaults is the configuration with the default tags set.
func tagDefaults() Config {
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

// oneLine is an error of envconfig as one line naming the variable.
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

// setDefaults fills what derives from other settings: the group from the
// pipeline, TLS from its files, and the SASL mechanism's spelling.
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
