package deploy

import (
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The kustomization renders with kustomize's own API, as kubectl apply -k
// renders it, and every object it renders decodes strictly into its
// Kubernetes type and is the object of its file, unchanged: what the other
// tests check of the files is what a cluster receives.
func TestKustomizationRenders(t *testing.T) {
	dir, err := filepath.Abs(repoPath(k8sDir))
	if err != nil {
		t.Fatal(err)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", k8sDir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	rendered := &manifests{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		services: map[string]*corev1.Service{}, deployments: map[string]*appsv1.Deployment{},
		pdbs: map[string]*policyv1.PodDisruptionBudget{}, kinds: map[string][]string{}}
	docs := yamlDocs(out)
	for i, doc := range docs {
		if _, err := rendered.add("rendered", doc); err != nil {
			t.Fatalf("rendered document %d: %v\n%s", i+1, err, doc)
		}
	}
	files := loadManifests(t)
	n := 0
	for _, pair := range []struct {
		kind             string
		rendered, inFile any
	}{
		{"ConfigMap", rendered.configMaps, files.configMaps},
		{"Secret", rendered.secrets, files.secrets},
		{"Service", rendered.services, files.services},
		{"Deployment", rendered.deployments, files.deployments},
		{"PodDisruptionBudget", rendered.pdbs, files.pdbs},
	} {
		r, f := reflect.ValueOf(pair.rendered), reflect.ValueOf(pair.inFile)
		var rn, fn []string
		for _, k := range r.MapKeys() {
			rn = append(rn, k.String())
		}
		for _, k := range f.MapKeys() {
			fn = append(fn, k.String())
		}
		slices.Sort(rn)
		slices.Sort(fn)
		if !slices.Equal(rn, fn) {
			t.Errorf("%s: rendered %v, files hold %v", pair.kind, rn, fn)
			continue
		}
		for _, name := range rn {
			n++
			got, want := r.MapIndex(reflect.ValueOf(name)).Interface(), f.MapIndex(reflect.ValueOf(name)).Interface()
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s %s: rendered differs from its file:\nrendered %+v\nfile     %+v", pair.kind, name, got, want)
			}
		}
	}
	if n != len(docs) || n < 10 {
		t.Fatalf("compared %d objects of %d rendered; want all, at least the 10 of two pipelines", n, len(docs))
	}
	if len(rendered.keda) != 0 {
		t.Errorf("the kustomization renders KEDA objects; they are optional")
	}
	t.Logf("%d objects rendered and compared", n)
}
