package deploy

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"dedupe-worker/config"
	"dedupe-worker/internal/app"
)

const (
	k8sDir = "deploy/kubernetes"
	// partitionsAnnotation on a Deployment gives the partition count of
	// its input topic, which no other file states in a form a test can
	// read.
	partitionsAnnotation = "dedupe-worker/input-partitions"
	// placeholder starts every value of a committed Secret.
	placeholder = "REPLACE_ME"
)

// manifests is everything under deploy/kubernetes, decoded.
type manifests struct {
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	services    map[string]*corev1.Service
	deployments map[string]*appsv1.Deployment
	pdbs        map[string]*policyv1.PodDisruptionBudget
	// keda holds the keda.sh objects, generic: the KEDA types are not a
	// dependency of this module.
	keda []kedaObject
	// kustomization is kustomization.yaml; kustomizationDir its folder.
	kustomization    map[string]any
	kustomizationDir string
	// kinds lists the kinds of each file, by its path relative to
	// deploy/kubernetes.
	kinds map[string][]string
}

type kedaObject struct {
	file string
	kind string
	name string
	obj  map[string]any
}

// loadManifests decodes every YAML document under deploy/kubernetes into
// its Kubernetes API type, strictly: an unknown or miscased field, a
// duplicate key or an apiVersion/kind this repository does not use fails.
func loadManifests(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{
		configMaps:  map[string]*corev1.ConfigMap{},
		secrets:     map[string]*corev1.Secret{},
		services:    map[string]*corev1.Service{},
		deployments: map[string]*appsv1.Deployment{},
		pdbs:        map[string]*policyv1.PodDisruptionBudget{},
		kinds:       map[string][]string{},
	}
	dir := repoPath(k8sDir)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		rel = filepath.ToSlash(rel)
		switch filepath.Ext(path) {
		case ".yaml":
		case ".yml":
			return fmt.Errorf("%s: name it .yaml, as the others", rel)
		default:
			return fmt.Errorf("%s: only .yaml files belong in %s", rel, k8sDir)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		docs := yamlDocs(data)
		if len(docs) == 0 {
			return fmt.Errorf("%s: no document", rel)
		}
		for i, doc := range docs {
			kind, err := m.add(rel, doc)
			if err != nil {
				return fmt.Errorf("%s, document %d: %w", rel, i+1, err)
			}
			m.kinds[rel] = append(m.kinds[rel], kind)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.deployments) == 0 {
		t.Fatalf("no Deployment in %s", k8sDir)
	}
	return m
}

func (m *manifests) add(rel string, doc []byte) (string, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return "", err
	}
	gvk := tm.APIVersion + " " + tm.Kind
	var name string
	var err error
	switch gvk {
	case "v1 ConfigMap":
		name, err = decodeInto(doc, m.configMaps, func(o *corev1.ConfigMap) string { return o.Name })
	case "v1 Secret":
		name, err = decodeInto(doc, m.secrets, func(o *corev1.Secret) string { return o.Name })
	case "v1 Service":
		name, err = decodeInto(doc, m.services, func(o *corev1.Service) string { return o.Name })
	case "apps/v1 Deployment":
		name, err = decodeInto(doc, m.deployments, func(o *appsv1.Deployment) string { return o.Name })
	case "policy/v1 PodDisruptionBudget":
		name, err = decodeInto(doc, m.pdbs, func(o *policyv1.PodDisruptionBudget) string { return o.Name })
	case "kustomize.config.k8s.io/v1beta1 Kustomization":
		if filepath.Base(rel) != "kustomization.yaml" || m.kustomization != nil {
			return "", fmt.Errorf("one kustomization.yaml only, at the top of %s", k8sDir)
		}
		if err := decodeStrict(doc, &m.kustomization); err != nil {
			return "", err
		}
		m.kustomizationDir = filepath.Dir(rel)
		return tm.Kind, nil
	case "keda.sh/v1alpha1 ScaledObject", "keda.sh/v1alpha1 TriggerAuthentication":
		var o map[string]any
		if err := decodeStrict(doc, &o); err != nil {
			return "", err
		}
		name, _ := dig(o, "metadata", "name").(string)
		if name == "" {
			return "", fmt.Errorf("%s without metadata.name", tm.Kind)
		}
		m.keda = append(m.keda, kedaObject{file: rel, kind: tm.Kind, name: name, obj: o})
		return tm.Kind, nil
	default:
		return "", fmt.Errorf("unexpected apiVersion %q kind %q", tm.APIVersion, tm.Kind)
	}
	if err != nil {
		return "", err
	}
	if name == "" {
		return "", fmt.Errorf("%s without metadata.name", tm.Kind)
	}
	return tm.Kind, nil
}

// decodeInto decodes doc strictly into a new T and files it under its
// name, which must be new.
func decodeInto[T any](doc []byte, into map[string]*T, nameOf func(*T) string) (string, error) {
	o := new(T)
	if err := decodeStrict(doc, o); err != nil {
		return "", err
	}
	name := nameOf(o)
	if _, dup := into[name]; dup {
		return "", fmt.Errorf("a second object named %q of the same kind", name)
	}
	into[name] = o
	return name, nil
}

// dig walks nested maps (and list indexes as ints).
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			mm, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = mm[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// pipeline is one Deployment with what it reads.
type pipeline struct {
	d         *appsv1.Deployment
	container corev1.Container
	cm        *corev1.ConfigMap
	secret    *corev1.Secret
	// env is every DEDUPE_* variable the container gets.
	env map[string]string
	cfg config.Config
}

// pipelines resolves each Deployment's configuration as the kubelet
// would hand it to the container (ConfigMap, then Secret, then env; later
// sources win) and loads it with config.Load.
func (m *manifests) pipelines(t *testing.T) []pipeline {
	t.Helper()
	var ps []pipeline
	for _, name := range sortedKeys(m.deployments) {
		d := m.deployments[name]
		cs := d.Spec.Template.Spec.Containers
		if len(cs) != 1 {
			t.Fatalf("Deployment %s: want one container, the worker; got %d", name, len(cs))
		}
		p := pipeline{d: d, container: cs[0], env: map[string]string{}}
		for _, src := range p.container.EnvFrom {
			if src.Prefix != "" {
				t.Errorf("Deployment %s: envFrom with prefix %q: the variable names would change", name, src.Prefix)
			}
			switch {
			case src.ConfigMapRef != nil:
				cm := m.configMaps[src.ConfigMapRef.Name]
				if cm == nil {
					t.Fatalf("Deployment %s: envFrom ConfigMap %q is not in %s", name, src.ConfigMapRef.Name, k8sDir)
				}
				if src.ConfigMapRef.Optional != nil && *src.ConfigMapRef.Optional {
					t.Errorf("Deployment %s: ConfigMap %s must not be optional", name, cm.Name)
				}
				p.cm = cm
				for k, v := range cm.Data {
					p.env[k] = v
				}
				for k, v := range cm.BinaryData {
					p.env[k] = string(v)
				}
			case src.SecretRef != nil:
				s := m.secrets[src.SecretRef.Name]
				if s == nil {
					t.Fatalf("Deployment %s: envFrom Secret %q is not in %s", name, src.SecretRef.Name, k8sDir)
				}
				if src.SecretRef.Optional != nil && *src.SecretRef.Optional {
					t.Errorf("Deployment %s: Secret %s must not be optional", name, s.Name)
				}
				p.secret = s
				for k, v := range secretData(s) {
					p.env[k] = v
				}
			}
		}
		if p.cm == nil || p.secret == nil {
			t.Fatalf("Deployment %s: want envFrom a ConfigMap and a Secret", name)
		}
		for _, e := range p.container.Env {
			if e.ValueFrom != nil && strings.HasPrefix(e.Name, config.Prefix+"_") {
				t.Errorf("Deployment %s: env %s from valueFrom: keep DEDUPE_* variables in the ConfigMap or Secret", name, e.Name)
			}
			if strings.HasPrefix(e.Name, config.Prefix+"_") {
				p.env[e.Name] = e.Value
			}
		}
		cfg, err := loadConfig(t, p.env)
		if err != nil {
			t.Fatalf("Deployment %s: config.Load with its ConfigMap and Secret: %v", name, err)
		}
		p.cfg = cfg
		ps = append(ps, p)
	}
	return ps
}

// secretData is a Secret's data as the container sees it: data, then
// stringData over it (the API server merges them that way).
func secretData(s *corev1.Secret) map[string]string {
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	for k, v := range s.StringData {
		out[k] = v
	}
	return out
}

func TestManifestsDecodeStrictly(t *testing.T) {
	m := loadManifests(t)
	want := map[string]int{"ConfigMap": len(m.configMaps), "Secret": len(m.secrets), "Service": len(m.services),
		"PodDisruptionBudget": len(m.pdbs)}
	for kind, n := range want {
		if n != len(m.deployments) {
			t.Errorf("%d %s objects for %d Deployments: want one per pipeline", n, kind, len(m.deployments))
		}
	}
	if m.kustomization == nil {
		t.Error("no kustomization.yaml")
	}
}

// The strict decoding above must reject what a typo makes.
func TestStrictDecodingRejectsTypos(t *testing.T) {
	good := "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replicas: 1\n"
	var d appsv1.Deployment
	if err := decodeStrict([]byte(good), &d); err != nil || *d.Spec.Replicas != 1 {
		t.Fatalf("a good document: %v", err)
	}
	for _, bad := range []string{
		strings.Replace(good, "replicas", "replica", 1),              // unknown field
		strings.Replace(good, "replicas", "Replicas", 1),             // case
		good + "  replicas: 2\n",                                     // duplicate key
		strings.Replace(good, "replicas: 1", "replicas: one", 1),     // wrong type
		strings.Replace(good, "  name: x", "  name: x\n  nme: y", 1), // typo in metadata
	} {
		var d appsv1.Deployment
		if err := decodeStrict([]byte(bad), &d); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
	m := &manifests{deployments: map[string]*appsv1.Deployment{}}
	if _, err := m.add("x.yaml", []byte("apiVersion: apps/v1beta1\nkind: Deployment\nmetadata:\n  name: x\n")); err == nil {
		t.Error("an old apiVersion was accepted")
	}
}

func TestKustomizationListsRequiredResources(t *testing.T) {
	m := loadManifests(t)
	if m.kustomizationDir != "." {
		t.Fatalf("kustomization.yaml is in %s, want the top of %s", m.kustomizationDir, k8sDir)
	}
	raw, _ := m.kustomization["resources"].([]any)
	listed := map[string]bool{}
	for _, r := range raw {
		s, _ := r.(string)
		if s == "" || listed[s] {
			t.Errorf("resources: empty or repeated entry %v", r)
		}
		listed[s] = true
		if _, ok := m.kinds[s]; !ok {
			t.Errorf("resources: %s is not a manifest in %s", s, k8sDir)
		}
	}
	for file, kinds := range m.kinds {
		if file == "kustomization.yaml" {
			continue
		}
		optional := false
		for _, k := range kinds {
			if k == "ScaledObject" || k == "TriggerAuthentication" {
				optional = true
			}
		}
		switch {
		case optional && listed[file]:
			t.Errorf("%s needs KEDA: it is optional and must not be in kustomization.yaml", file)
		case optional:
			if !strings.Contains(string(readRepoFile(t, k8sDir, file)), "OPTIONAL") {
				t.Errorf("%s: say OPTIONAL in its header comment", file)
			}
		case !listed[file]:
			t.Errorf("%s (%s) is not in kustomization.yaml", file, strings.Join(kinds, ", "))
		}
	}
}

func TestDeploymentConfiguration(t *testing.T) {
	m := loadManifests(t)
	known := knownVars(t)
	for _, p := range m.pipelines(t) {
		name := p.d.Name
		checkKnownKeys(t, "ConfigMap "+p.cm.Name, p.cm.Data)
		checkKnownKeys(t, "Secret "+p.secret.Name, secretData(p.secret))
		for _, k := range sortedKeys(p.cm.Data) {
			if strings.Contains(k, "PASSWORD") {
				t.Errorf("ConfigMap %s: %s belongs in the Secret", p.cm.Name, k)
			}
		}
		sd := secretData(p.secret)
		for _, k := range []string{"DEDUPE_KAFKA_SASL_PASSWORD", "DEDUPE_REDIS_PASSWORD"} {
			if _, ok := sd[k]; !ok {
				t.Errorf("Secret %s: no %s", p.secret.Name, k)
			}
			if _, ok := p.cm.Data[k]; ok {
				t.Errorf("ConfigMap %s: %s is a secret", p.cm.Name, k)
			}
		}
		for k, v := range sd {
			if !strings.HasPrefix(v, placeholder) {
				t.Errorf("Secret %s: %s must be a %s placeholder in the repository", p.secret.Name, k, placeholder)
			}
		}
		for k := range p.env {
			if _, ok := known[k]; !ok {
				t.Errorf("Deployment %s: %s is not a config.Config variable", name, k)
			}
		}
		if got := p.d.Labels["app.kubernetes.io/instance"]; got != p.cfg.Pipeline {
			t.Errorf("Deployment %s: label app.kubernetes.io/instance %q, want the pipeline %q", name, got, p.cfg.Pipeline)
		}
		if want := "dedupe-worker-" + p.cfg.Pipeline; name != want {
			// The dashboard finds the pods by this name.
			t.Errorf("Deployment %s: want the name %s", name, want)
		}
		if img := p.container.Image; !strings.Contains(img, "@sha256:") {
			if i := strings.LastIndex(img, ":"); i < 0 || strings.Contains(img[i:], "/") || img[i+1:] == "latest" {
				t.Errorf("Deployment %s: image %q: pin a tag (not latest) or a digest", name, img)
			}
		}
		for _, e := range p.container.Env {
			if !strings.HasPrefix(e.Name, config.Prefix+"_") && e.Name != "GOMEMLIMIT" && e.Name != "GOMAXPROCS" {
				t.Errorf("Deployment %s: unexpected variable %s", name, e.Name)
			}
		}
	}
}

// httpPort is the port DEDUPE_HTTP_ADDR names.
func httpPort(t *testing.T, cfg config.Config) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(cfg.HTTPAddr)
	if err != nil {
		t.Fatalf("DEDUPE_HTTP_ADDR %q: %v", cfg.HTTPAddr, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n <= 0 || n > 65535 {
		t.Fatalf("DEDUPE_HTTP_ADDR %q: want a fixed port number", cfg.HTTPAddr)
	}
	return int32(n)
}

// resolvePort turns a probe's or Service's port (number or name) into the
// container's port number, 0 if the name is not one of its ports.
func resolvePort(c corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

func TestProbes(t *testing.T) {
	m := loadManifests(t)
	for _, p := range m.pipelines(t) {
		port := httpPort(t, p.cfg)
		found := false
		for _, cp := range p.container.Ports {
			if cp.ContainerPort == port {
				found = true
			}
		}
		if !found {
			t.Errorf("Deployment %s: no container port %d (DEDUPE_HTTP_ADDR %s)", p.d.Name, port, p.cfg.HTTPAddr)
		}
		for _, pr := range []struct {
			kind, path string
			probe      *corev1.Probe
		}{{"livenessProbe", "/healthz", p.container.LivenessProbe}, {"readinessProbe", "/readyz", p.container.ReadinessProbe}} {
			if pr.probe == nil || pr.probe.HTTPGet == nil {
				t.Errorf("Deployment %s: want an httpGet %s", p.d.Name, pr.kind)
				continue
			}
			g := pr.probe.HTTPGet
			if g.Path != pr.path {
				t.Errorf("Deployment %s: %s path %q, want %s", p.d.Name, pr.kind, g.Path, pr.path)
			}
			if got := resolvePort(p.container, g.Port); got != port {
				t.Errorf("Deployment %s: %s port %s is %d, want %d from DEDUPE_HTTP_ADDR", p.d.Name, pr.kind, g.Port.String(), got, port)
			}
			if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
				t.Errorf("Deployment %s: %s scheme %s: the worker serves plain HTTP", p.d.Name, pr.kind, g.Scheme)
			}
		}
	}
}

// The pod must outlive the worker's own shutdown: after SIGTERM it
// finishes the batches in hand within DEDUPE_SHUTDOWN_TIMEOUT, then waits
// for the group's reader to close for up to the same timeout
// (consumer.Worker.Run), then closes producers and HTTP within 5 s.
func TestTerminationGracePeriod(t *testing.T) {
	m := loadManifests(t)
	for _, p := range m.pipelines(t) {
		g := p.d.Spec.Template.Spec.TerminationGracePeriodSeconds
		if g == nil {
			t.Errorf("Deployment %s: terminationGracePeriodSeconds not set (default 30s = DEDUPE_SHUTDOWN_TIMEOUT's default)", p.d.Name)
			continue
		}
		grace := time.Duration(*g) * time.Second
		if need := app.ShutdownBound(p.cfg); grace < need {
			t.Errorf("Deployment %s: terminationGracePeriodSeconds %v, want at least the worker's shutdown bound %v (DEDUPE_SHUTDOWN_TIMEOUT %v)",
				p.d.Name, grace, need, p.cfg.ShutdownTimeout)
		}
	}
}

func TestSecurityContext(t *testing.T) {
	m := loadManifests(t)
	for _, p := range m.pipelines(t) {
		name := p.d.Name
		pod := p.d.Spec.Template.Spec.SecurityContext
		c := p.container.SecurityContext
		if pod == nil || c == nil {
			t.Errorf("Deployment %s: want a pod and a container securityContext", name)
			continue
		}
		// The container's settings win over the pod's.
		runAsNonRoot := c.RunAsNonRoot
		if runAsNonRoot == nil {
			runAsNonRoot = pod.RunAsNonRoot
		}
		if runAsNonRoot == nil || !*runAsNonRoot {
			t.Errorf("Deployment %s: runAsNonRoot is not true", name)
		}
		user := c.RunAsUser
		if user == nil {
			user = pod.RunAsUser
		}
		if user == nil || *user == 0 {
			t.Errorf("Deployment %s: want a numeric, non-zero runAsUser", name)
		} else if want := imageUser(t); *user != want {
			t.Errorf("Deployment %s: runAsUser %d, the image's USER is %d", name, *user, want)
		}
		seccomp := c.SeccompProfile
		if seccomp == nil {
			seccomp = pod.SeccompProfile
		}
		if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("Deployment %s: want seccompProfile RuntimeDefault", name)
		}
		if c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
			t.Errorf("Deployment %s: readOnlyRootFilesystem is not true", name)
		}
		if c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation {
			t.Errorf("Deployment %s: allowPrivilegeEscalation is not false", name)
		}
		if c.Privileged != nil && *c.Privileged {
			t.Errorf("Deployment %s: privileged", name)
		}
		dropsAll := false
		if c.Capabilities != nil {
			for _, cp := range c.Capabilities.Drop {
				dropsAll = dropsAll || cp == "ALL"
			}
			if len(c.Capabilities.Add) > 0 {
				t.Errorf("Deployment %s: adds capabilities %v", name, c.Capabilities.Add)
			}
		}
		if !dropsAll {
			t.Errorf("Deployment %s: capabilities do not drop ALL", name)
		}
		if len(p.d.Spec.Template.Spec.Volumes) > 0 {
			t.Errorf("Deployment %s: volumes: the worker writes nothing and needs none", name)
		}
		if s := p.d.Spec.Template.Spec; s.EnableServiceLinks == nil || *s.EnableServiceLinks {
			t.Errorf("Deployment %s: set enableServiceLinks false (service variables start with DEDUPE_ for dedupe-worker-* Services)", name)
		}
	}
}

func TestResources(t *testing.T) {
	m := loadManifests(t)
	for _, p := range m.pipelines(t) {
		r := p.container.Resources
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, okReq := r.Requests[res]
			lim, okLim := r.Limits[res]
			if !okReq || !okLim || req.IsZero() || lim.IsZero() {
				t.Errorf("Deployment %s: %s request and limit must both be set", p.d.Name, res)
				continue
			}
			if req.Cmp(lim) > 0 {
				t.Errorf("Deployment %s: %s request %s above limit %s", p.d.Name, res, req.String(), lim.String())
			}
		}
		// GOMEMLIMIT, if set, stays under the memory limit.
		for _, e := range p.container.Env {
			if e.Name != "GOMEMLIMIT" {
				continue
			}
			v := strings.TrimSuffix(e.Value, "B") // Go's MiB is the Kubernetes Mi
			q, err := resource.ParseQuantity(v)
			lim := r.Limits[corev1.ResourceMemory]
			if err != nil || q.Cmp(lim) >= 0 {
				t.Errorf("Deployment %s: GOMEMLIMIT %q must be below the memory limit %s", p.d.Name, e.Value, lim.String())
			}
		}
	}
}

func inputPartitions(t *testing.T, d *appsv1.Deployment) int {
	t.Helper()
	n, err := strconv.Atoi(d.Annotations[partitionsAnnotation])
	if err != nil || n < 1 {
		t.Fatalf("Deployment %s: annotation %s %q: want the input topic's partition count", d.Name, partitionsAnnotation, d.Annotations[partitionsAnnotation])
	}
	return n
}

// One pod at a time, and never an extra group member (see the comment on
// the strategy in clicks/deployment.yaml).
func TestRolloutStrategy(t *testing.T) {
	m := loadManifests(t)
	for _, p := range m.pipelines(t) {
		s := p.d.Spec.Strategy
		if s.Type != appsv1.RollingUpdateDeploymentStrategyType || s.RollingUpdate == nil {
			t.Errorf("Deployment %s: want a RollingUpdate strategy", p.d.Name)
			continue
		}
		if ru := s.RollingUpdate; ru.MaxSurge == nil || ru.MaxSurge.String() != "0" || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "1" {
			t.Errorf("Deployment %s: want maxSurge 0 and maxUnavailable 1, got %v and %v", p.d.Name, ru.MaxSurge, ru.MaxUnavailable)
		}
		parts := inputPartitions(t, p.d)
		if r := p.d.Spec.Replicas; r == nil || *r < 2 || int(*r) > parts {
			t.Errorf("Deployment %s: want 2 to %d replicas (the input topic's partitions), got %v", p.d.Name, parts, r)
		}
		sel, err := metav1.LabelSelectorAsSelector(p.d.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(p.d.Spec.Template.Labels)) {
			t.Errorf("Deployment %s: its selector does not select its own pod template (%v)", p.d.Name, err)
		}
	}
}

// The PDB and the Service select the pods of their pipeline's Deployment
// and of no other.
func TestSelectors(t *testing.T) {
	m := loadManifests(t)
	ps := m.pipelines(t)
	matches := func(sel labels.Selector) []string {
		var names []string
		for _, p := range ps {
			if sel.Matches(labels.Set(p.d.Spec.Template.Labels)) {
				names = append(names, p.d.Name)
			}
		}
		return names
	}
	for _, p := range ps {
		inst := p.d.Labels["app.kubernetes.io/instance"]
		var pdb *policyv1.PodDisruptionBudget
		for _, x := range m.pdbs {
			if x.Labels["app.kubernetes.io/instance"] == inst {
				pdb = x
			}
		}
		if pdb == nil {
			t.Errorf("Deployment %s: no PodDisruptionBudget labelled instance %s", p.d.Name, inst)
		} else {
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if got := matches(sel); err != nil || len(got) != 1 || got[0] != p.d.Name {
				t.Errorf("PodDisruptionBudget %s selects the pods of %v, want only %s (%v)", pdb.Name, got, p.d.Name, err)
			}
			// A drain must be able to go on: at least one pod may go.
			replicas := int(*p.d.Spec.Replicas)
			switch s := pdb.Spec; {
			case s.MaxUnavailable != nil && s.MinAvailable == nil:
				if n, err := intstr.GetScaledValueFromIntOrPercent(s.MaxUnavailable, replicas, true); err != nil || n < 1 {
					t.Errorf("PodDisruptionBudget %s: maxUnavailable %s lets no pod go", pdb.Name, s.MaxUnavailable.String())
				}
			case s.MinAvailable != nil && s.MaxUnavailable == nil:
				if n, err := intstr.GetScaledValueFromIntOrPercent(s.MinAvailable, replicas, true); err != nil || n >= replicas {
					t.Errorf("PodDisruptionBudget %s: minAvailable %s lets no pod go", pdb.Name, s.MinAvailable.String())
				}
			default:
				t.Errorf("PodDisruptionBudget %s: set one of maxUnavailable and minAvailable", pdb.Name)
			}
		}

		var svc *corev1.Service
		for _, x := range m.services {
			if x.Labels["app.kubernetes.io/instance"] == inst {
				svc = x
			}
		}
		if svc == nil {
			t.Errorf("Deployment %s: no Service labelled instance %s", p.d.Name, inst)
			continue
		}
		if got := matches(labels.SelectorFromSet(svc.Spec.Selector)); len(svc.Spec.Selector) == 0 || len(got) != 1 || got[0] != p.d.Name {
			t.Errorf("Service %s selects the pods of %v, want only %s", svc.Name, got, p.d.Name)
		}
		port := httpPort(t, p.cfg)
		if len(svc.Spec.Ports) != 1 || resolvePort(p.container, svc.Spec.Ports[0].TargetPort) != port {
			t.Errorf("Service %s: want one port with targetPort the container's %d", svc.Name, port)
		}
		want := map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": strconv.Itoa(int(port)), "prometheus.io/path": "/metrics"}
		for k, v := range want {
			if got := svc.Annotations[k]; got != v {
				t.Errorf("Service %s: annotation %s %q, want %q", svc.Name, k, got, v)
			}
		}
	}
}

// kedaSASL maps DEDUPE_KAFKA_SASL_MECHANISM to the KEDA kafka scaler's
// sasl values.
var kedaSASL = map[string]string{"": "none", config.SASLPlain: "plaintext", config.SASLScramSHA256: "scram_sha256", config.SASLScramSHA512: "scram_sha512"}

func TestKEDAScaledObject(t *testing.T) {
	m := loadManifests(t)
	ps := m.pipelines(t)
	byName := map[string]pipeline{}
	for _, p := range ps {
		byName[p.d.Name] = p
	}
	auths := map[string]kedaObject{}
	var scaled []kedaObject
	for _, o := range m.keda {
		if o.kind == "TriggerAuthentication" {
			auths[o.name] = o
		} else {
			scaled = append(scaled, o)
		}
	}
	if len(scaled) == 0 {
		t.Fatal("no ScaledObject")
	}
	for _, so := range scaled {
		spec, _ := so.obj["spec"].(map[string]any)
		ref, _ := spec["scaleTargetRef"].(map[string]any)
		p, ok := byName[fmt.Sprint(ref["name"])]
		if !ok {
			t.Errorf("ScaledObject %s: scaleTargetRef.name %v is not a Deployment", so.name, ref["name"])
			continue
		}
		if k, ok := ref["kind"]; ok && k != "Deployment" {
			t.Errorf("ScaledObject %s: scaleTargetRef.kind %v", so.name, k)
		}
		parts := inputPartitions(t, p.d)
		// Numbers decode as int64 (sigs.k8s.io/json keeps integers).
		lo, okLo := spec["minReplicaCount"].(int64)
		hi, okHi := spec["maxReplicaCount"].(int64)
		if !okLo || !okHi || lo < 1 || lo > hi || int(hi) > parts {
			t.Errorf("ScaledObject %s: want 1 <= minReplicaCount <= maxReplicaCount <= %d (partitions of %s), got %v and %v",
				so.name, parts, p.cfg.InputTopic, spec["minReplicaCount"], spec["maxReplicaCount"])
		}
		triggers, _ := spec["triggers"].([]any)
		if len(triggers) != 1 {
			t.Errorf("ScaledObject %s: want one trigger, got %d", so.name, len(triggers))
			continue
		}
		tr, _ := triggers[0].(map[string]any)
		md, _ := tr["metadata"].(map[string]any)
		wantTLS := "disable"
		if p.cfg.KafkaTLS {
			wantTLS = "enable"
		}
		for k, want := range map[string]string{
			"consumerGroup":      p.cfg.GroupID,
			"topic":              p.cfg.InputTopic,
			"bootstrapServers":   strings.Join(p.cfg.KafkaBrokers, ","),
			"sasl":               kedaSASL[p.cfg.KafkaSASLMechanism],
			"tls":                wantTLS,
			"allowIdleConsumers": "false",
		} {
			if got := md[k]; got != want {
				t.Errorf("ScaledObject %s: trigger metadata %s %v, want %q (from ConfigMap %s)", so.name, k, got, want, p.cm.Name)
			}
		}
		if tr["type"] != "kafka" {
			t.Errorf("ScaledObject %s: trigger type %v, want kafka", so.name, tr["type"])
		}
		if n, err := strconv.Atoi(fmt.Sprint(md["lagThreshold"])); err != nil || n < 1 {
			t.Errorf("ScaledObject %s: lagThreshold %v: want a positive integer (as a string)", so.name, md["lagThreshold"])
		}
		if p.cfg.KafkaSASLMechanism == "" {
			continue
		}
		// SASL: the TriggerAuthentication reads the user and password the
		// workers use.
		authName := fmt.Sprint(dig(tr, "authenticationRef", "name"))
		auth, ok := auths[authName]
		if !ok {
			t.Errorf("ScaledObject %s: authenticationRef %q is not a TriggerAuthentication here", so.name, authName)
			continue
		}
		params := map[string]string{}
		for _, ref := range []struct {
			field string
			data  map[string]string
			obj   string
		}{{"secretTargetRef", secretData(p.secret), p.secret.Name}, {"configMapTargetRef", p.cm.Data, p.cm.Name}} {
			list, _ := dig(auth.obj, "spec", ref.field).([]any)
			for _, x := range list {
				e, _ := x.(map[string]any)
				if e["name"] != ref.obj {
					t.Errorf("TriggerAuthentication %s: %s names %v, want %s", auth.name, ref.field, e["name"], ref.obj)
				}
				key := fmt.Sprint(e["key"])
				if _, ok := ref.data[key]; !ok {
					t.Errorf("TriggerAuthentication %s: %s key %s is not in %s", auth.name, ref.field, key, ref.obj)
				}
				params[fmt.Sprint(e["parameter"])] = key
			}
		}
		if params["username"] != "DEDUPE_KAFKA_SASL_USERNAME" || params["password"] != "DEDUPE_KAFKA_SASL_PASSWORD" {
			t.Errorf("TriggerAuthentication %s: parameters %v, want username and password from DEDUPE_KAFKA_SASL_USERNAME and _PASSWORD", auth.name, params)
		}
	}
}

// imageUser is the numeric user of the Dockerfile's final stage.
func imageUser(t *testing.T) int64 {
	t.Helper()
	stages, err := parseDockerfile(string(readRepoFile(t, "Dockerfile")))
	if err != nil {
		t.Fatal(err)
	}
	u, ok := stages[len(stages)-1].last("USER")
	if !ok {
		t.Fatal("the Dockerfile's final stage has no USER")
	}
	uid, _, _ := strings.Cut(u.args, ":")
	n, err := strconv.ParseInt(uid, 10, 64)
	if err != nil {
		t.Fatalf("the final stage's USER %q is not numeric", u.args)
	}
	return n
}
