package bloom

import (
	"errors"
	"testing"
	"time"
)

// Each check takes its limits and refuses one step past them, and the
// engine applies it: NewPlan, Window and Config refuse what it refuses.
func TestChecksAreTheLimits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ok, bad []error
	}{
		{"window", []error{CheckWindowLength(time.Second), CheckWindowLength(MaxWindowLength)},
			[]error{CheckWindowLength(0), CheckWindowLength(1500 * time.Millisecond), CheckWindowLength(MaxWindowLength + time.Second)}},
		{"max lag", []error{CheckMaxLag(0), CheckMaxLag(MaxLagBound)},
			[]error{CheckMaxLag(-time.Second), CheckMaxLag(time.Millisecond), CheckMaxLag(MaxLagBound + time.Second)}},
		{"elements", []error{CheckElements(1), CheckElements(MaxElements)}, []error{CheckElements(0), CheckElements(MaxElements + 1)}},
		{"rate", []error{CheckFPR(MinFPR), CheckFPR(0.5)}, []error{CheckFPR(MinFPR / 2), CheckFPR(1)}},
		{"shards", []error{CheckShards(1), CheckShards(MaxShards)}, []error{CheckShards(0), CheckShards(MaxShards + 1)}},
		{"growth", []error{CheckGrowth(1), CheckGrowth(MaxGrowthFactor)}, []error{CheckGrowth(0.5), CheckGrowth(MaxGrowthFactor + 1)}},
		{"memory factor", []error{CheckMemoryFactor(1), CheckMemoryFactor(MaxMemoryFactor)},
			[]error{CheckMemoryFactor(0.9), CheckMemoryFactor(MaxMemoryFactor + 0.5)}},
		{"call timeout", []error{CheckCallTimeout(MinCallTimeout), CheckCallTimeout(MaxCallTimeout)},
			[]error{CheckCallTimeout(MinCallTimeout - 1), CheckCallTimeout(MaxCallTimeout + 1)}},
		{"min replicas", []error{CheckMinReplicas(0), CheckMinReplicas(MaxMinReplicas)}, []error{CheckMinReplicas(-1), CheckMinReplicas(MaxMinReplicas + 1)}},
	} {
		for i, err := range tc.ok {
			if err != nil {
				t.Errorf("%s: limit %d refused: %v", tc.name, i, err)
			}
		}
		for i, err := range tc.bad {
			if err == nil {
				t.Errorf("%s: value %d past the limits accepted", tc.name, i)
			}
		}
	}
	// The engine applies them.
	if _, err := NewPlan(1000, 1e-6, PlanOptions{MemoryFactor: MaxMemoryFactor + 1}); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("NewPlan with a memory factor past MaxMemoryFactor: %v, want ErrInvalidPlan", err)
	}
	if _, err := NewPlan(1000, 1e-6, PlanOptions{MaxGrowth: MaxGrowthFactor * 2}); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("NewPlan with a growth past MaxGrowthFactor: %v, want ErrInvalidPlan", err)
	}
	plan, err := NewPlan(1000, 1e-6, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range []func(*Config){
		func(c *Config) { c.CallTimeout = MaxCallTimeout + time.Second },
		func(c *Config) { c.CallTimeout = MinCallTimeout / 2 },
		func(c *Config) { c.MinReplicas = MaxMinReplicas + 1 },
	} {
		cfg := Config{Pipeline: "p", Plan: plan, Window: Window{Length: time.Minute}}
		set(&cfg)
		cfg.setDefaults()
		if err := cfg.validate(); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}
