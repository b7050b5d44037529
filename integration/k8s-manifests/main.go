// check-manifests: vmlet's Kubernetes manifests (deploy/*.yaml) against the Kubernetes API
// types they name, as the API server would decode them: each YAML document strictly decoded
// into its kind (k8s.io/api at the version in go.mod): an unknown or misspelt field, a wrong
// type or a bad quantity is an error; then the checks the API server's validation makes that
// matter here (names, labels, selectors), and what ties the files together (the DaemonSet's
// and Job's service accounts bound to roles that may patch nodes, the image, the label the
// installer sets and the RuntimeClass selects).
//
// Usage: check-manifests -image NAME -label KEY=VALUE -metrics-gid GID FILE...
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

type checker struct {
	errs []string
	// Where the document being checked is: FILE (document N).
	where string
}

func (c *checker) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf("%s: %s", c.where, fmt.Sprintf(format, args...)))
}

func (c *checker) name(what, name string, subdomain bool) {
	var problems []string
	if subdomain {
		problems = validation.IsDNS1123Subdomain(name)
	} else {
		problems = validation.IsDNS1123Label(name)
	}
	for _, p := range problems {
		c.fail("%s %q: %s", what, name, p)
	}
}

func (c *checker) labelSet(what string, set map[string]string) {
	for k, v := range set {
		for _, p := range validation.IsQualifiedName(k) {
			c.fail("%s key %q: %s", what, k, p)
		}
		for _, p := range validation.IsValidLabelValue(v) {
			c.fail("%s %q value %q: %s", what, k, v, p)
		}
	}
}

func (c *checker) meta(kind string, m metav1.ObjectMeta, namespaced bool) {
	c.name(kind+" name", m.Name, true)
	if namespaced {
		if m.Namespace == "" {
			c.fail("%s %s has no namespace", kind, m.Name)
		} else {
			c.name(kind+" namespace", m.Namespace, false)
		}
	} else if m.Namespace != "" {
		c.fail("%s %s is cluster-scoped but names namespace %s", kind, m.Name, m.Namespace)
	}
	c.labelSet(kind+" label", m.Labels)
}

// A list of a string type (capabilities, operations) as strings.
func toStrings[T ~string](list []T) []string {
	out := make([]string, len(list))
	for i, x := range list {
		out[i] = string(x)
	}
	return out
}

// A pod template: the installer's needs (the host's root, its PIDs, the node's name for the
// label, the image).
func (c *checker) podTemplate(owner string, t corev1.PodTemplateSpec, image string, accounts map[string]bool) {
	c.labelSet(owner+" pod label", t.Labels)
	c.labelSet(owner+" nodeSelector", t.Spec.NodeSelector)
	s := t.Spec
	if !accounts[s.ServiceAccountName] {
		c.fail("%s runs as service account %q, which no ServiceAccount here is", owner, s.ServiceAccountName)
	}
	if !s.HostPID {
		c.fail("%s: hostPID is needed to restart the host's containerd", owner)
	}
	hostRoot := map[string]bool{}
	for _, v := range s.Volumes {
		if v.HostPath != nil && v.HostPath.Path == "/" {
			hostRoot[v.Name] = true
		}
	}
	if len(s.Containers) == 0 {
		c.fail("%s has no container, expected the installer's", owner)
		return
	}
	if len(s.Containers) != 1 {
		c.fail("%s: the installer runs alone in its pod (the metrics have a DaemonSet of their own)", owner)
	}
	k := s.Containers[0]
	c.name(owner+" container name", k.Name, false)
	if k.Image != image {
		c.fail("%s runs image %q, not the installer %q", owner, k.Image, image)
	}
	if k.SecurityContext == nil || k.SecurityContext.Privileged == nil || !*k.SecurityContext.Privileged {
		c.fail("%s's container must be privileged (chroot, setns into the host's init)", owner)
	}
	mounted := false
	for _, m := range k.VolumeMounts {
		if hostRoot[m.Name] && m.MountPath == "/host" {
			mounted = true
		}
	}
	if !mounted {
		c.fail("%s does not mount the host's / at /host", owner)
	}
	args := strings.Join(k.Command, " ")
	if !strings.Contains(args, "--root=/host") || !strings.Contains(args, "--node=$(NODE_NAME)") {
		c.fail("%s's command %q lacks --root=/host or --node=$(NODE_NAME)", owner, args)
	}
	nodeName := false
	for _, e := range k.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
			e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeName = true
		}
	}
	if !nodeName {
		c.fail("%s's container has no NODE_NAME from spec.nodeName", owner)
	}
}

func main() {
	image := flag.String("image", "", "the installer image the pods must run")
	label := flag.String("label", "", "KEY=VALUE: the label vmletctl install sets")
	metricsGID := flag.Int64("metrics-gid", 0, "the node config's default metrics_gid")
	flag.Parse()
	key, value, ok := strings.Cut(*label, "=")
	if *image == "" || !ok || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: check-manifests -image NAME -label KEY=VALUE -metrics-gid GID FILE...")
		os.Exit(2)
	}

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme,
		batchv1.AddToScheme, rbacv1.AddToScheme, nodev1.AddToScheme, networkingv1.AddToScheme,
		admissionregistrationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	decoder := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
		json.SerializerOptions{Yaml: true, Strict: true})

	c := &checker{}
	var objects []runtime.Object
	files := map[runtime.Object]string{}
	fileOf := map[runtime.Object]string{}
	for _, file := range flag.Args() {
		c.where = file
		data, err := os.ReadFile(file)
		if err != nil {
			c.fail("%v", err)
			continue
		}
		reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		n := 0
		for {
			doc, err := reader.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				c.fail("%v", err)
				break
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			n++
			c.where = fmt.Sprintf("%s (document %d)", file, n)
			obj, gvk, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				c.fail("%v", err)
				continue
			}
			fmt.Printf("%s: %s %s\n", file, gvk.Kind, obj.(metav1.Object).GetName())
			objects = append(objects, obj)
			files[obj] = c.where
			fileOf[obj] = file
		}
	}

	// Each file on its own must stand: the cleanup runs after the installer's file is deleted.
	byFile := map[string][]runtime.Object{}
	for _, o := range objects {
		byFile[fileOf[o]] = append(byFile[fileOf[o]], o)
	}
	for _, file := range flag.Args() {
		objs := byFile[file]
		accounts := map[string]bool{}
		rolesPatchingNodes := map[string]bool{}
		for _, o := range objs {
			switch v := o.(type) {
			case *corev1.ServiceAccount:
				accounts[v.Name] = true
			case *rbacv1.ClusterRole:
				get, patch := false, false
				for _, r := range v.Rules {
					if contains(r.APIGroups, "") && contains(r.Resources, "nodes") {
						get = get || contains(r.Verbs, "get")
						patch = patch || contains(r.Verbs, "patch")
					}
				}
				rolesPatchingNodes[v.Name] = get && patch
			}
		}
		// The service accounts whose node patches a policy of the file narrows (each with a
		// Deny binding).
		narrowed := ownNodePolicies(objs)
		bound := map[string]bool{}
		for _, o := range objs {
			if b, ok := o.(*rbacv1.ClusterRoleBinding); ok {
				if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.APIGroup != rbacv1.GroupName {
					c.fail("ClusterRoleBinding %s: roleRef must be a ClusterRole of %s", b.Name, rbacv1.GroupName)
				}
				for _, s := range b.Subjects {
					if s.Kind == rbacv1.ServiceAccountKind && rolesPatchingNodes[b.RoleRef.Name] {
						bound[s.Name] = true
						if !narrowed[s.Namespace+"/"+s.Name] {
							c.where = files[b]
							c.fail("service account %s/%s may patch every node: its file has no ValidatingAdmissionPolicy (bound with Deny) that keeps it to its own node's vmlet.io/ labels", s.Namespace, s.Name)
						}
					}
				}
			}
		}
		for _, o := range objs {
			c.where = files[o]
			switch v := o.(type) {
			case *corev1.ServiceAccount:
				c.meta("ServiceAccount", v.ObjectMeta, true)
			case *rbacv1.ClusterRole:
				c.meta("ClusterRole", v.ObjectMeta, false)
			case *rbacv1.ClusterRoleBinding:
				c.meta("ClusterRoleBinding", v.ObjectMeta, false)
			case *nodev1.RuntimeClass:
				c.meta("RuntimeClass", v.ObjectMeta, false)
				c.name("RuntimeClass handler", v.Handler, false)
				if v.Scheduling == nil || v.Scheduling.NodeSelector[key] != value {
					c.fail("RuntimeClass %s does not select nodes labelled %s=%s", v.Name, key, value)
				} else {
					c.labelSet("RuntimeClass nodeSelector", v.Scheduling.NodeSelector)
				}
				if v.Overhead == nil || v.Overhead.PodFixed.Memory().IsZero() || v.Overhead.PodFixed.Cpu().IsZero() {
					c.fail("RuntimeClass %s has no overhead.podFixed memory and cpu", v.Name)
				}
			case *appsv1.DaemonSet:
				c.meta("DaemonSet", v.ObjectMeta, true)
				selector, err := metav1.LabelSelectorAsSelector(v.Spec.Selector)
				if err != nil {
					c.fail("DaemonSet %s selector: %v", v.Name, err)
				} else if selector.Empty() || !selector.Matches(labels.Set(v.Spec.Template.Labels)) {
					c.fail("DaemonSet %s: its selector does not match its pods' labels", v.Name)
				}
				if runsMetrics(v.Spec.Template) {
					c.metricsTemplate("DaemonSet "+v.Name, v.Spec.Template, *image, key, value, *metricsGID)
				} else {
					c.podTemplate("DaemonSet "+v.Name, v.Spec.Template, *image, accounts)
					if !bound[v.Spec.Template.Spec.ServiceAccountName] {
						c.fail("DaemonSet %s's service account may not get and patch nodes", v.Name)
					}
				}
				if v.Spec.Template.Spec.RestartPolicy != "" && v.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyAlways {
					c.fail("DaemonSet %s: a DaemonSet's pods restart Always", v.Name)
				}
			case *corev1.Service:
				c.meta("Service", v.ObjectMeta, true)
				selects := false
				for _, o := range objs {
					if d, ok := o.(*appsv1.DaemonSet); ok && len(v.Spec.Selector) > 0 &&
						labels.SelectorFromSet(v.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) &&
						d.Namespace == v.Namespace {
						for _, k := range d.Spec.Template.Spec.Containers {
							for _, p := range k.Ports {
								for _, sp := range v.Spec.Ports {
									selects = selects || (sp.TargetPort.StrVal == p.Name && p.Name != "")
								}
							}
						}
					}
				}
				if !selects {
					c.fail("Service %s selects no port of a DaemonSet's pods in its file", v.Name)
				}
			case *batchv1.Job:
				c.meta("Job", v.ObjectMeta, true)
				c.podTemplate("Job "+v.Name, v.Spec.Template, *image, accounts)
				if !bound[v.Spec.Template.Spec.ServiceAccountName] {
					c.fail("Job %s's service account may not get and patch nodes", v.Name)
				}
				p := v.Spec.Template.Spec.RestartPolicy
				if p != corev1.RestartPolicyNever && p != corev1.RestartPolicyOnFailure {
					c.fail("Job %s: restartPolicy must be Never or OnFailure, not %q", v.Name, p)
				}
				if v.Spec.Template.Spec.NodeSelector[key] != value {
					c.fail("Job %s does not go to nodes labelled %s=%s", v.Name, key, value)
				}
			case *networkingv1.NetworkPolicy:
				c.meta("NetworkPolicy", v.ObjectMeta, true)
				c.metricsPolicy(v, objects)
			case *admissionregistrationv1.ValidatingAdmissionPolicy:
				c.meta("ValidatingAdmissionPolicy", v.ObjectMeta, false)
				if v.Spec.FailurePolicy == nil || *v.Spec.FailurePolicy != admissionregistrationv1.Fail {
					c.fail("ValidatingAdmissionPolicy %s: failurePolicy must be Fail (an error must not let a patch through)", v.Name)
				}
			case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
				c.meta("ValidatingAdmissionPolicyBinding", v.ObjectMeta, false)
			default:
				c.fail("unexpected kind %T", o)
			}
		}
	}
	if len(c.errs) > 0 {
		for _, e := range c.errs {
			fmt.Fprintln(os.Stderr, "check-manifests:", e)
		}
		os.Exit(1)
	}
	fmt.Printf("check-manifests: %d objects in %d files valid\n", len(objects), flag.NArg())
}

// Whether a pod template runs `vmletctl metrics` (the metrics DaemonSet's).
func runsMetrics(t corev1.PodTemplateSpec) bool {
	for _, k := range t.Spec.Containers {
		if strings.Contains(strings.Join(k.Command, " "), "vmletctl metrics") {
			return true
		}
	}
	return false
}

// The metrics DaemonSet's pods: `vmletctl metrics` alone, in the installer's image, on the
// nodes the installer labelled, as a non-root user of the node config's default
// metrics_gid, without the host's namespaces, a service account token, a capability or
// privilege escalation, its only volume the shims' published directory, read-only.
func (c *checker) metricsTemplate(owner string, t corev1.PodTemplateSpec, image, key, value string, gid int64) {
	c.labelSet(owner+" pod label", t.Labels)
	s := t.Spec
	if s.NodeSelector[key] != value {
		c.fail("%s does not go to nodes labelled %s=%s", owner, key, value)
	}
	if s.HostPID || s.HostNetwork || s.HostIPC {
		c.fail("%s shares a host namespace; the metrics need none", owner)
	}
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		c.fail("%s mounts a service account token; the metrics need none", owner)
	}
	ps := s.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil ||
		*ps.RunAsUser != gid || ps.RunAsGroup == nil || *ps.RunAsGroup != gid {
		c.fail("%s must run as uid and gid %d (the node config's default metrics_gid: a user no other process of the node is)", owner, gid)
	} else if !containsInt(ps.SupplementalGroups, gid) {
		c.fail("%s's supplementalGroups lack the node config's default metrics_gid %d", owner, gid)
	}
	published := map[string]bool{}
	for _, v := range s.Volumes {
		if v.HostPath == nil || !strings.HasSuffix(v.HostPath.Path, "/.metrics") {
			c.fail("%s's volume %s is not the shims' published directory (STATE_DIR/.metrics)", owner, v.Name)
		}
		published[v.Name] = true
	}
	if len(s.Containers) != 1 {
		c.fail("%s: `vmletctl metrics` runs alone in its pod", owner)
	}
	for _, m := range s.Containers {
		c.name(owner+" container name", m.Name, false)
		if !strings.Contains(strings.Join(m.Command, " "), "vmletctl metrics") {
			c.fail("%s's container %s: only `vmletctl metrics` runs", owner, m.Name)
		}
		if m.Image != image {
			c.fail("%s's container %s runs image %q, not the installer %q", owner, m.Name, m.Image, image)
		}
		sc := m.SecurityContext
		if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.Capabilities == nil ||
			!contains(toStrings(sc.Capabilities.Drop), "ALL") || len(sc.Capabilities.Add) > 0 ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			c.fail("%s's container %s must drop every capability and privilege escalation; it only reads", owner, m.Name)
		}
		for _, vm := range m.VolumeMounts {
			if !published[vm.Name] || !vm.ReadOnly {
				c.fail("%s's container %s mounts %s, which is not the published directory read-only", owner, m.Name, vm.Name)
			}
		}
	}
}

func containsInt(list []int64, x int64) bool {
	for _, y := range list {
		if y == x {
			return true
		}
	}
	return false
}

// The service accounts ("namespace/name") that a ValidatingAdmissionPolicy among objs
// keeps to their own node's vmlet.io/ labels: a policy on node updates, failing closed,
// whose match condition names the account, which checks the node its token is bound to,
// the label prefix, and that the spec, annotations, owner references and finalizers stay,
// and which a binding among objs applies with Deny to everything its policy matches.
func ownNodePolicies(objs []runtime.Object) map[string]bool {
	denied := map[string]bool{}
	for _, o := range objs {
		if b, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding); ok {
			// A binding that narrows what its policy sees narrows what it refuses.
			if b.Spec.MatchResources != nil || b.Spec.ParamRef != nil {
				continue
			}
			for _, a := range b.Spec.ValidationActions {
				denied[b.Spec.PolicyName] = denied[b.Spec.PolicyName] || a == admissionregistrationv1.Deny
			}
		}
	}
	narrowed := map[string]bool{}
	for _, o := range objs {
		p, ok := o.(*admissionregistrationv1.ValidatingAdmissionPolicy)
		if !ok || !denied[p.Name] || p.Spec.MatchConstraints == nil {
			continue
		}
		nodes := false
		for _, r := range p.Spec.MatchConstraints.ResourceRules {
			nodes = nodes || (contains(r.APIGroups, "") && contains(r.Resources, "nodes") &&
				contains(toStrings(r.Operations), string(admissionregistrationv1.Update)))
		}
		checks := ""
		for _, v := range p.Spec.Validations {
			checks += v.Expression + "\n"
		}
		for _, v := range p.Spec.Variables {
			checks += v.Expression + "\n"
		}
		failsClosed := p.Spec.FailurePolicy != nil && *p.Spec.FailurePolicy == admissionregistrationv1.Fail
		if !nodes || !failsClosed || !strings.Contains(checks, "authentication.kubernetes.io/node-name") ||
			!strings.Contains(checks, `"vmlet.io/"`) {
			continue
		}
		// Everything of the node but its labels is kept as it was.
		keepsTheRest := true
		for _, kept := range []string{"object.spec == oldObject.spec", "annotations", "ownerReferences", "finalizers"} {
			keepsTheRest = keepsTheRest && strings.Contains(checks, kept)
		}
		if !keepsTheRest {
			continue
		}
		for _, m := range p.Spec.MatchConditions {
			const prefix = "system:serviceaccount:"
			i := strings.Index(m.Expression, prefix)
			if i < 0 {
				continue
			}
			account := strings.TrimRight(m.Expression[i+len(prefix):], `"' `)
			parts := strings.SplitN(account, ":", 2)
			if len(parts) == 2 {
				narrowed[parts[0]+"/"+parts[1]] = true
			}
		}
	}
	return narrowed
}

// A NetworkPolicy (deploy/vmlet-metrics-networkpolicy.yaml) must select the pods of a
// DaemonSet among all the files, in its namespace, and admit ingress to their metrics port
// only.
func (c *checker) metricsPolicy(p *networkingv1.NetworkPolicy, objects []runtime.Object) {
	selector, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
	if err != nil || selector.Empty() {
		c.fail("NetworkPolicy %s: its podSelector must name the installer's pods", p.Name)
		return
	}
	selects := false
	for _, o := range objects {
		if d, ok := o.(*appsv1.DaemonSet); ok && d.Namespace == p.Namespace &&
			selector.Matches(labels.Set(d.Spec.Template.Labels)) {
			selects = true
		}
	}
	if !selects {
		c.fail("NetworkPolicy %s selects no DaemonSet's pods in namespace %s", p.Name, p.Namespace)
	}
	if len(p.Spec.PolicyTypes) != 1 || p.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
		c.fail("NetworkPolicy %s: policyTypes must be [Ingress] (the installer reaches the API server)", p.Name)
	}
	for _, rule := range p.Spec.Ingress {
		if len(rule.From) == 0 {
			c.fail("NetworkPolicy %s: a rule without from admits everyone", p.Name)
		}
		for _, port := range rule.Ports {
			if port.Port == nil || port.Port.StrVal != "metrics" {
				c.fail("NetworkPolicy %s: only the port named metrics is served", p.Name)
			}
		}
		if len(rule.Ports) == 0 {
			c.fail("NetworkPolicy %s: a rule without ports admits every port", p.Name)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s || x == "*" {
			return true
		}
	}
	return false
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}
