// Experimental local API server for operator tests, built only from Debian's Go source packages:
// k8s.io/apiextensions-apiserver (real CRD handling) + generic etcd-backed storage for a few
// built-in kinds (no validation, no controllers) + a tiny garbage collector (owner references and
// the contents of deleted namespaces).
package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	extensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	"k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation/field"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/apiserver/pkg/util/openapi"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	restclient "k8s.io/client-go/rest"
	"k8s.io/component-base/cli"
	"k8s.io/klog/v2"
	"k8s.io/kube-openapi/pkg/common"
	openapiutil "k8s.io/kube-openapi/pkg/util"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

var (
	builtinScheme = runtime.NewScheme()
	builtinCodecs = serializer.NewCodecFactory(builtinScheme)
	builtinGVs    = []schema.GroupVersion{corev1.SchemeGroupVersion, appsv1.SchemeGroupVersion, batchv1.SchemeGroupVersion, coordinationv1.SchemeGroupVersion, rbacv1.SchemeGroupVersion, policyv1.SchemeGroupVersion}
)

type res struct {
	gv         schema.GroupVersion
	plural     string
	kind       string
	namespaced bool
	status     bool
}

var builtins = []res{
	{corev1.SchemeGroupVersion, "namespaces", "Namespace", false, true},
	{corev1.SchemeGroupVersion, "nodes", "Node", false, true},
	{corev1.SchemeGroupVersion, "configmaps", "ConfigMap", true, false},
	{corev1.SchemeGroupVersion, "secrets", "Secret", true, false},
	{corev1.SchemeGroupVersion, "events", "Event", true, false},
	{corev1.SchemeGroupVersion, "services", "Service", true, true},
	{corev1.SchemeGroupVersion, "serviceaccounts", "ServiceAccount", true, false},
	{corev1.SchemeGroupVersion, "pods", "Pod", true, true},
	{corev1.SchemeGroupVersion, "persistentvolumeclaims", "PersistentVolumeClaim", true, true},
	{appsv1.SchemeGroupVersion, "deployments", "Deployment", true, true},
	{appsv1.SchemeGroupVersion, "statefulsets", "StatefulSet", true, true},
	{appsv1.SchemeGroupVersion, "daemonsets", "DaemonSet", true, true},
	{appsv1.SchemeGroupVersion, "replicasets", "ReplicaSet", true, true},
	{batchv1.SchemeGroupVersion, "jobs", "Job", true, true},
	{batchv1.SchemeGroupVersion, "cronjobs", "CronJob", true, true},
	{coordinationv1.SchemeGroupVersion, "leases", "Lease", true, false},
	{rbacv1.SchemeGroupVersion, "roles", "Role", true, false},
	{rbacv1.SchemeGroupVersion, "rolebindings", "RoleBinding", true, false},
	{rbacv1.SchemeGroupVersion, "clusterroles", "ClusterRole", false, false},
	{rbacv1.SchemeGroupVersion, "clusterrolebindings", "ClusterRoleBinding", false, false},
	{policyv1.SchemeGroupVersion, "poddisruptionbudgets", "PodDisruptionBudget", true, true},
}

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, coordinationv1.AddToScheme, rbacv1.AddToScheme, policyv1.AddToScheme} {
		if err := add(builtinScheme); err != nil {
			panic(err)
		}
	}
	// The versioned Go types double as the "internal" version: no conversions needed.
	for _, gv := range builtinGVs {
		for kind, t := range builtinScheme.KnownTypes(gv) {
			if strings.HasSuffix(kind, "Options") || kind == "WatchEvent" || kind == "Status" {
				continue
			}
			builtinScheme.AddKnownTypeWithName(schema.GroupVersion{Group: gv.Group, Version: runtime.APIVersionInternal}.WithKind(kind), reflect.New(t).Interface().(runtime.Object))
		}
		_ = builtinScheme.SetVersionPriority(gv)
	}
	metav1.AddToGroupVersion(builtinScheme, schema.GroupVersion{Version: "v1"})
	builtinScheme.AddUnversionedTypes(schema.GroupVersion{Version: "v1"}, &metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
}

// ---- a permissive strategy: no validation, spec/status split, generation bumps ----

type strategy struct {
	runtime.ObjectTyper
	names.NameGenerator
	namespaced, hasStatus, statusOnly bool
}

func toMap(o runtime.Object) map[string]interface{} {
	m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	return m
}
func fromMap(m map[string]interface{}, into runtime.Object) {
	fresh := reflect.New(reflect.TypeOf(into).Elem()).Interface()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, fresh); err == nil {
		reflect.ValueOf(into).Elem().Set(reflect.ValueOf(fresh).Elem())
	}
}
func specPart(m map[string]interface{}) map[string]interface{} {
	c := map[string]interface{}{}
	for k, v := range m {
		if k != "metadata" && k != "status" && k != "apiVersion" && k != "kind" {
			c[k] = v
		}
	}
	return c
}

func (s strategy) NamespaceScoped() bool { return s.namespaced }
func (s strategy) PrepareForCreate(ctx context.Context, obj runtime.Object) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetGeneration(1)
	}
}
func (s strategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	n, o := toMap(obj), toMap(old)
	if s.statusOnly {
		rv := n["metadata"].(map[string]interface{})["resourceVersion"]
		st := n["status"]
		n = o
		n["status"] = st
		n["metadata"].(map[string]interface{})["resourceVersion"] = rv
	} else if s.hasStatus {
		if st, ok := o["status"]; ok {
			n["status"] = st
		} else {
			delete(n, "status")
		}
	}
	gen, _, _ := unstructured.NestedInt64(o, "metadata", "generation")
	if !s.statusOnly && !reflect.DeepEqual(specPart(n), specPart(o)) {
		gen++
	}
	_ = unstructured.SetNestedField(n, gen, "metadata", "generation")
	fromMap(n, obj)
}
func (strategy) Validate(context.Context, runtime.Object) field.ErrorList  { return nil }
func (strategy) WarningsOnCreate(context.Context, runtime.Object) []string { return nil }
func (strategy) AllowCreateOnUpdate() bool                                 { return false }
func (strategy) AllowUnconditionalUpdate() bool                            { return true }
func (strategy) Canonicalize(runtime.Object)                               {}
func (strategy) ValidateUpdate(context.Context, runtime.Object, runtime.Object) field.ErrorList {
	return nil
}
func (strategy) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}

type statusREST struct{ store *genericregistry.Store }

func (r *statusREST) New() runtime.Object { return r.store.New() }
func (r *statusREST) Destroy()            {}
func (r *statusREST) Get(ctx context.Context, name string, o *metav1.GetOptions) (runtime.Object, error) {
	return r.store.Get(ctx, name, o)
}
func (r *statusREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, cv rest.ValidateObjectFunc, uv rest.ValidateObjectUpdateFunc, force bool, o *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return r.store.Update(ctx, name, objInfo, cv, uv, false, o)
}
func (r *statusREST) ConvertToTable(ctx context.Context, obj runtime.Object, t runtime.Object) (*metav1.Table, error) {
	return r.store.ConvertToTable(ctx, obj, t)
}

func newStorage(r res, getter generic.RESTOptionsGetter) (rest.Storage, rest.Storage, error) {
	gr := schema.GroupResource{Group: r.gv.Group, Resource: r.plural}
	s := strategy{ObjectTyper: builtinScheme, NameGenerator: names.SimpleNameGenerator, namespaced: r.namespaced, hasStatus: r.status}
	newObj := func() runtime.Object { o, _ := builtinScheme.New(r.gv.WithKind(r.kind)); return o }
	newList := func() runtime.Object { o, _ := builtinScheme.New(r.gv.WithKind(r.kind + "List")); return o }
	store := &genericregistry.Store{
		NewFunc: newObj, NewListFunc: newList,
		DefaultQualifiedResource:  gr,
		SingularQualifiedResource: schema.GroupResource{Group: r.gv.Group, Resource: strings.ToLower(r.kind)},
		CreateStrategy:            s, UpdateStrategy: s, DeleteStrategy: s,
		TableConvertor: rest.NewDefaultTableConvertor(gr),
	}
	if err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: getter}); err != nil {
		return nil, nil, err
	}
	if !r.status {
		return &withShort{store, shortNames[r.plural]}, nil, nil
	}
	ss := *store
	ss.UpdateStrategy = strategy{ObjectTyper: builtinScheme, NameGenerator: names.SimpleNameGenerator, namespaced: r.namespaced, hasStatus: true, statusOnly: true}
	return &withShort{store, shortNames[r.plural]}, &statusREST{store: &ss}, nil
}

type withShort struct {
	*genericregistry.Store
	short []string
}

func (w *withShort) ShortNames() []string { return w.short }

var shortNames = map[string][]string{"namespaces": {"ns"}, "configmaps": {"cm"}, "events": {"ev"}, "services": {"svc"},
	"serviceaccounts": {"sa"}, "pods": {"po"}, "persistentvolumeclaims": {"pvc"}, "deployments": {"deploy"},
	"statefulsets": {"sts"}, "daemonsets": {"ds"}, "replicasets": {"rs"}, "cronjobs": {"cj"}, "nodes": {"no"}, "poddisruptionbudgets": {"pdb"}}

// ---- OpenAPI: real definitions for apiextensions, schemaless objects for the built-ins ----

func definitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	defs := openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(generatedopenapi.GetOpenAPIDefinitions)(ref)
	for _, gv := range builtinGVs {
		for _, t := range builtinScheme.KnownTypes(gv) {
			name := openapiutil.GetCanonicalTypeName(reflect.New(t).Interface())
			if _, ok := defs[name]; !ok {
				defs[name] = common.OpenAPIDefinition{Schema: spec.Schema{
					SchemaProps:      spec.SchemaProps{Type: []string{"object"}},
					VendorExtensible: spec.VendorExtensible{Extensions: spec.Extensions{"x-kubernetes-preserve-unknown-fields": true}},
				}}
			}
		}
	}
	return defs
}

// ---- legacy (non-aggregated) /apis listing that includes the CRD groups ----

func discoveryShim(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.TrimSuffix(r.URL.Path, "/") == "/apis" && !strings.Contains(r.Header.Get("Accept"), "apidiscovery.k8s.io") {
			req := httptest.NewRequest(http.MethodGet, "/apis", nil).WithContext(r.Context())
			req.Header.Set("Accept", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, req)
			var agg struct {
				Items []struct {
					Metadata struct{ Name string }      `json:"metadata"`
					Versions []struct{ Version string } `json:"versions"`
				} `json:"items"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &agg)
			list := metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{}}
			for _, it := range agg.Items {
				g := metav1.APIGroup{Name: it.Metadata.Name}
				for _, v := range it.Versions {
					g.Versions = append(g.Versions, metav1.GroupVersionForDiscovery{GroupVersion: it.Metadata.Name + "/" + v.Version, Version: v.Version})
				}
				if len(g.Versions) > 0 {
					g.PreferredVersion = g.Versions[0]
				}
				list.Groups = append(list.Groups, g)
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(list)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ---- minimal garbage collector: delete objects all of whose owners are gone, and the contents of
// namespaces that existed once and are gone now (there is no namespace controller) ----

func gcLoop(ctx context.Context, cfg *restclient.Config) {
	dc := discovery.NewDiscoveryClientForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	for _, ns := range []string{"default", "kube-system", "kube-public"} {
		obj := &unstructured.Unstructured{Object: map[string]interface{}{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]interface{}{"name": ns}}}
		for i := 0; i < 50; i++ {
			_, err := dyn.Resource(corev1.SchemeGroupVersion.WithResource("namespaces")).Create(ctx, obj, metav1.CreateOptions{})
			if err == nil || apierrors.IsAlreadyExists(err) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	seenNS := map[string]bool{}
	for ctx.Err() == nil {
		time.Sleep(time.Second)
		gcPass(ctx, dc, dyn, seenNS)
	}
}

type listed struct {
	gvr schema.GroupVersionResource
	obj unstructured.Unstructured
}

type kindInfo struct {
	gvr        schema.GroupVersionResource
	namespaced bool
}

// gcPass lists everything once, then deletes (in the background) the objects of vanished namespaces
// and the objects whose owners are all confirmed gone by a direct GET (a list can be stale).
func gcPass(ctx context.Context, dc *discovery.DiscoveryClient, dyn *dynamic.DynamicClient, seenNS map[string]bool) {
	bg := metav1.DeletePropagationBackground
	lists, _ := dc.ServerPreferredResources()
	liveNS, nsListed := map[string]bool{}, false
	uids := map[string]bool{}
	kinds := map[string]kindInfo{}
	var all []listed
	for _, l := range lists {
		gv, _ := schema.ParseGroupVersion(l.GroupVersion)
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !hasVerb(r.Verbs, "list") || !hasVerb(r.Verbs, "delete") {
				continue
			}
			gvr := gv.WithResource(r.Name)
			kinds[gv.Group+"/"+r.Kind] = kindInfo{gvr, r.Namespaced}
			ul, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			isNS := gvr.Group == "" && gvr.Resource == "namespaces"
			nsListed = nsListed || isNS
			for _, it := range ul.Items {
				uids[string(it.GetUID())] = true
				if isNS {
					liveNS[it.GetName()], seenNS[it.GetName()] = true, true
				}
				all = append(all, listed{gvr, it})
			}
		}
	}
	for _, x := range all {
		ns := x.obj.GetNamespace()
		why := ""
		switch {
		case x.obj.GetDeletionTimestamp() != nil:
			continue
		case nsListed && ns != "" && seenNS[ns] && !liveNS[ns]:
			why = "namespace gone"
		case ownersGone(ctx, dyn, kinds, uids, ns, x.obj.GetOwnerReferences()):
			why = "owners gone"
		default:
			continue
		}
		klog.Infof("mini-gc: deleting %s %s/%s (%s)", x.gvr.Resource, ns, x.obj.GetName(), why)
		_ = dyn.Resource(x.gvr).Namespace(ns).Delete(ctx, x.obj.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg})
	}
}

func ownersGone(ctx context.Context, dyn *dynamic.DynamicClient, kinds map[string]kindInfo, uids map[string]bool, ns string, refs []metav1.OwnerReference) bool {
	if len(refs) == 0 {
		return false
	}
	for _, ref := range refs {
		if uids[string(ref.UID)] {
			return false
		}
	}
	for _, ref := range refs {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		k, ok := kinds[gv.Group+"/"+ref.Kind]
		if err != nil || !ok {
			return false // unknown kind: cannot tell, keep the object
		}
		var ri dynamic.ResourceInterface = dyn.Resource(k.gvr)
		if k.namespaced {
			ri = dyn.Resource(k.gvr).Namespace(ns)
		}
		o, err := ri.Get(ctx, ref.Name, metav1.GetOptions{})
		if err == nil && o.GetUID() == ref.UID || err != nil && !apierrors.IsNotFound(err) {
			return false
		}
	}
	return true
}

func hasVerb(vs []string, v string) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}

func main() {
	ctx := genericapiserver.SetupSignalContext()
	o := options.NewCustomResourceDefinitionsServerOptions(os.Stdout, os.Stderr)
	cmd := &cobra.Command{
		Use: "mini-apiserver",
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return o.ServerRunOptions.ComponentGlobalsRegistry.Set()
		},
		RunE: func(c *cobra.Command, args []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			config, err := o.Config()
			if err != nil {
				return err
			}
			namer := openapinamer.NewDefinitionNamer(extensionsapiserver.Scheme, builtinScheme)
			config.GenericConfig.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(definitions, namer)
			config.GenericConfig.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(definitions, namer)
			orig := config.GenericConfig.BuildHandlerChainFunc
			config.GenericConfig.BuildHandlerChainFunc = func(h http.Handler, gc *genericapiserver.Config) http.Handler {
				return orig(discoveryShim(h), gc)
			}
			cc := config.Complete()
			cc.GenericConfig.EnableDiscovery = true // no kube-aggregator in front of us
			server, err := cc.New(genericapiserver.NewEmptyDelegate())
			if err != nil {
				return err
			}

			sc := o.RecommendedOptions.Etcd.StorageConfig
			sc.Codec = builtinCodecs.LegacyCodec(builtinGVs...)
			sc.StorageObjectCountTracker = config.GenericConfig.StorageObjectCountTracker
			getter := &genericoptions.StorageFactoryRestOptionsFactory{Options: *o.RecommendedOptions.Etcd, StorageFactory: &genericoptions.SimpleStorageFactory{StorageConfig: sc}}
			infos := map[string]*genericapiserver.APIGroupInfo{}
			for _, r := range builtins {
				info, ok := infos[r.gv.Group]
				if !ok {
					i := genericapiserver.NewDefaultAPIGroupInfo(r.gv.Group, builtinScheme, metav1.ParameterCodec, builtinCodecs)
					info = &i
					infos[r.gv.Group] = info
				}
				if info.VersionedResourcesStorageMap[r.gv.Version] == nil {
					info.VersionedResourcesStorageMap[r.gv.Version] = map[string]rest.Storage{}
				}
				main, status, err := newStorage(r, getter)
				if err != nil {
					return err
				}
				info.VersionedResourcesStorageMap[r.gv.Version][r.plural] = main
				if status != nil {
					info.VersionedResourcesStorageMap[r.gv.Version][r.plural+"/status"] = status
				}
			}
			if err := server.GenericAPIServer.InstallLegacyAPIGroup("/api", infos[""]); err != nil {
				return err
			}
			for g, info := range infos {
				if g != "" {
					if err := server.GenericAPIServer.InstallAPIGroup(info); err != nil {
						return err
					}
				}
			}
			loop := server.GenericAPIServer.LoopbackClientConfig
			server.GenericAPIServer.AddPostStartHookOrDie("mini-gc", func(hc genericapiserver.PostStartHookContext) error {
				go gcLoop(hc, loop)
				return nil
			})
			return server.GenericAPIServer.PrepareRun().RunWithContext(c.Context())
		},
	}
	cmd.SetContext(ctx)
	o.AddFlags(cmd.Flags())
	os.Exit(cli.Run(cmd))
}
