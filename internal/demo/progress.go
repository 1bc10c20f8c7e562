package demo

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// snapshot is one scrape of every replica.
type snapshot struct {
	each  []counters
	total counters
	at    time.Time
}

func scrapeAll(ctx context.Context, urls []string) snapshot {
	s := snapshot{at: time.Now(), total: counters{verdicts: map[string]float64{}, dead: map[string]float64{}}}
	for _, u := range urls {
		c, err := scrape(ctx, u)
		if err != nil {
			c = counters{verdicts: map[string]float64{}, dead: map[string]float64{}}
		}
		s.each = append(s.each, c)
		s.total.add(c)
	}
	return s
}

// monitor shows the live progress line.
type monitor struct {
	quit, done chan struct{}
	o          Options
	urls       []string
	produced   *atomic.Int64
	width      int
	start      time.Time
	prev       snapshot
	rate       float64
}

func startMonitor(ctx context.Context, o Options, urls []string, produced *atomic.Int64) *monitor {
	m := &monitor{quit: make(chan struct{}), done: make(chan struct{}), o: o, urls: urls, produced: produced}
	m.prev = snapshot{at: time.Now()}
	m.start = m.prev.at
	every := 2 * time.Second
	if o.Terminal {
		every = 500 * time.Millisecond
	}
	go func() {
		defer close(m.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-m.quit:
				return
			case <-t.C:
				m.show(m.line(scrapeAll(ctx, urls), ""))
			}
		}
	}()
	return m
}

// line formats s; it also updates the rate, smoothed over a few seconds.
func (m *monitor) line(s snapshot, suffix string) string {
	decided := s.total.decided()
	if suffix != "" {
		// The last line: the average over the whole run.
		m.rate = decided / s.at.Sub(m.start).Seconds()
	} else if dt := s.at.Sub(m.prev.at).Seconds(); dt > 0 {
		r := max(0, decided-m.prev.total.decided()) / dt
		if m.rate == 0 {
			m.rate = r
		} else {
			m.rate = 0.5*m.rate + 0.5*r
		}
	}
	m.prev = s
	l := fmt.Sprintf("produced %s/%s  decided %s  forwarded %s  dead-lettered %s  %s events/s",
		group3(m.produced.Load()), group3(int64(m.o.N)), group3(int64(decided)), group3(int64(s.total.forwarded)),
		group3(int64(s.total.deadLettered())), group3(int64(m.rate)))
	if suffix != "" {
		l += "  " + suffix
	}
	return l
}

func (m *monitor) show(l string) {
	w := m.o.Progress
	if w == nil {
		return
	}
	if !m.o.Terminal {
		fmt.Fprintln(w, l)
		return
	}
	pad := max(0, m.width-len(l))
	m.width = len(l)
	fmt.Fprintf(w, "\r%s%s", l, strings.Repeat(" ", pad))
}

// stop ends the live line with a last scrape, shown with suffix unless
// suffix is empty, and returns that scrape.
func (m *monitor) stop(suffix string) snapshot {
	close(m.quit)
	<-m.done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := scrapeAll(ctx, m.urls)
	if suffix != "" {
		m.show(m.line(s, suffix))
	}
	if m.o.Terminal && m.o.Progress != nil && m.width > 0 {
		fmt.Fprintln(m.o.Progress)
	}
	return s
}

// group3 writes n with thousands separated by commas.
func group3(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
