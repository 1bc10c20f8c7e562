package demo

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// counters are what one scrape of a worker's /metrics says.
type counters struct {
	in, forwarded float64
	verdicts      map[string]float64 // by verdict label
	dead          map[string]float64 // by reason label
}

func (c counters) decided() float64 {
	var n float64
	for _, v := range c.verdicts {
		n += v
	}
	return n
}

func (c counters) deadLettered() float64 {
	var n float64
	for _, v := range c.dead {
		n += v
	}
	return n
}

// add sums o into c.
func (c *counters) add(o counters) {
	c.in += o.in
	c.forwarded += o.forwarded
	if c.verdicts == nil {
		c.verdicts, c.dead = map[string]float64{}, map[string]float64{}
	}
	for k, v := range o.verdicts {
		c.verdicts[k] += v
	}
	for k, v := range o.dead {
		c.dead[k] += v
	}
}

var scrapeClient = &http.Client{Timeout: 2 * time.Second}

// scrape reads the dedupe counters from the Prometheus text at url.
func scrape(ctx context.Context, url string) (counters, error) {
	c := counters{verdicts: map[string]float64{}, dead: map[string]float64{}}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return c, err
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("%s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "dedupe_") {
			continue
		}
		name, labels, value, ok := parseSample(line)
		if !ok {
			continue
		}
		switch name {
		case "dedupe_events_in_total":
			c.in = value
		case "dedupe_events_forwarded_total":
			c.forwarded = value
		case "dedupe_verdicts_total":
			c.verdicts[labels["verdict"]] = value
		case "dedupe_events_dead_lettered_total":
			c.dead[labels["reason"]] = value
		}
	}
	return c, sc.Err()
}

// parseSample reads one line of the Prometheus text format:
// name{k="v",...} value. Label values here never hold quotes or commas.
func parseSample(line string) (string, map[string]string, float64, bool) {
	sp := strings.LastIndexByte(line, ' ')
	if sp < 0 {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(line[sp+1:], 64)
	if err != nil {
		return "", nil, 0, false
	}
	head := line[:sp]
	name, rest, hasLabels := strings.Cut(head, "{")
	labels := map[string]string{}
	if hasLabels {
		for _, kv := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
			k, val, ok := strings.Cut(kv, "=")
			if ok {
				labels[k] = strings.Trim(val, `"`)
			}
		}
	}
	return name, labels, v, true
}
