// Command render renders the kipam Helm chart the way `helm template --include-crds` does,
// with Go's own text/template and the few Helm and sprig functions the chart uses. It exists
// because no helm binary can be installed where kipam is tested; it uses no module outside
// Go's standard library.
//
// Go has no YAML parser, so the caller (tests/chart) hands over Chart.yaml and the values as
// JSON:
//
//	render -chart DIR -input FILE [-notes]
//
// FILE is {"chart": {Chart.yaml}, "values": {values.yaml}, "overrides": [{...}, ...],
// "release": {"name": "...", "namespace": "..."}}. Overrides are merged over the values in
// order, as `helm -f` merges files (maps merge key by key, anything else replaces, null
// deletes). The output is every file of crds/ and every rendered template that is not empty,
// each after a `# Source:` line, separated by `---`; with -notes, templates/NOTES.txt instead.
//
// Templates run with missingkey=error: a template that reads a value values.yaml does not
// define fails, where Helm would print nothing.
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"
)

type input struct {
	Chart     map[string]any   `json:"chart"`
	Values    map[string]any   `json:"values"`
	Overrides []map[string]any `json:"overrides"`
	Release   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"release"`
}

func main() {
	chartDir := flag.String("chart", "", "the chart directory")
	inputFile := flag.String("input", "", "JSON with chart, values, overrides and release")
	notes := flag.Bool("notes", false, "render templates/NOTES.txt only")
	flag.Parse()
	out, err := run(*chartDir, *inputFile, *notes)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	os.Stdout.WriteString(out)
}

func run(chartDir, inputFile string, notes bool) (string, error) {
	raw, err := os.ReadFile(inputFile)
	if err != nil {
		return "", err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var in input
	if err := dec.Decode(&in); err != nil {
		return "", fmt.Errorf("%s: %w", inputFile, err)
	}
	values := numbers(in.Values).(map[string]any)
	for _, o := range in.Overrides {
		values = merge(values, numbers(o).(map[string]any))
	}
	chart := numbers(in.Chart).(map[string]any)
	data := map[string]any{
		"Values": values,
		"Chart": map[string]any{
			"Name":       chart["name"],
			"Version":    chart["version"],
			"AppVersion": chart["appVersion"],
		},
		"Release": map[string]any{
			"Name":      in.Release.Name,
			"Namespace": in.Release.Namespace,
			"Service":   "Helm",
		},
	}
	chartName, _ := chart["name"].(string)

	root := template.New("").Option("missingkey=error")
	root.Funcs(funcs(root))
	var names []string
	templates := filepath.Join(chartDir, "templates")
	err = filepath.WalkDir(templates, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(chartDir, path)
		rel = filepath.ToSlash(rel)
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if _, err := root.New(chartName + "/" + rel).Parse(string(text)); err != nil {
			return err
		}
		names = append(names, rel)
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(names)

	var out strings.Builder
	if notes {
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, chartName+"/templates/NOTES.txt", data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	crds, _ := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
	sort.Strings(crds)
	for _, path := range crds {
		text, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&out, "---\n# Source: %s/crds/%s\n%s", chartName, filepath.Base(path), ensureNewline(string(text)))
	}
	type rendered struct{ source, text string }
	var docs []rendered
	for _, rel := range names {
		base := filepath.Base(rel)
		if strings.HasPrefix(base, "_") || base == "NOTES.txt" {
			continue
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, chartName+"/"+rel, data); err != nil {
			return "", err
		}
		for _, doc := range splitDocuments(buf.String()) {
			docs = append(docs, rendered{chartName + "/" + rel, ensureNewline(doc)})
		}
	}
	// Helm's install order, so that `kubectl apply -f` of the output creates the namespace
	// before what lives in it.
	sort.SliceStable(docs, func(i, j int) bool {
		return rank(docs[i].text) < rank(docs[j].text)
	})
	for _, d := range docs {
		fmt.Fprintf(&out, "---\n# Source: %s\n%s", d.source, d.text)
	}
	return out.String(), nil
}

var installOrder = []string{
	"Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
	"PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass",
	"PersistentVolume", "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole",
	"ClusterRoleList", "ClusterRoleBinding", "ClusterRoleBindingList", "Role", "RoleList",
	"RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod", "ReplicationController",
	"ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
	"IngressClass", "Ingress", "APIService", "MutatingWebhookConfiguration",
	"ValidatingWebhookConfiguration",
}

var kindLine = regexp.MustCompile(`(?m)^kind:[ \t]*"?([A-Za-z]+)"?[ \t]*$`)

// rank is the position of the document's kind in Helm's install order (unknown kinds last).
func rank(doc string) int {
	m := kindLine.FindStringSubmatch(doc)
	if m != nil {
		for i, k := range installOrder {
			if k == m[1] {
				return i
			}
		}
	}
	return len(installOrder)
}

var separator = regexp.MustCompile(`(?m)^---[ \t]*$\n?`)

// splitDocuments drops the documents that are only blanks and comments, as Helm does.
func splitDocuments(text string) []string {
	var docs []string
	for _, doc := range separator.Split(text, -1) {
		empty := true
		for _, line := range strings.Split(doc, "\n") {
			t := strings.TrimSpace(line)
			if t != "" && !strings.HasPrefix(t, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, strings.TrimLeft(doc, "\n"))
		}
	}
	return docs
}

func ensureNewline(s string) string {
	if strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n"
}

// numbers turns json.Number into int64 (or float64 when not whole), as Helm's values hold.
func numbers(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = numbers(x)
		}
		return t
	case []any:
		for i, x := range t {
			t[i] = numbers(x)
		}
		return t
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i
		}
		f, _ := t.Float64()
		return f
	case nil:
		return nil
	default:
		return t
	}
}

func merge(base, over map[string]any) map[string]any {
	out := make(map[string]any, len(base))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		if v == nil {
			delete(out, k)
			continue
		}
		if bm, ok := out[k].(map[string]any); ok {
			if om, ok := v.(map[string]any); ok {
				out[k] = merge(bm, om)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// empty is sprig's notion: nil, false, 0, "", and empty lists and maps.
func empty(v any) bool {
	switch t := v.(type) {
	case nil:
		return true
	case bool:
		return !t
	case string:
		return t == ""
	case int64:
		return t == 0
	case int:
		return t == 0
	case float64:
		return t == 0
	case []any:
		return len(t) == 0
	case map[string]any:
		return len(t) == 0
	default:
		return false
	}
}

func funcs(root *template.Template) template.FuncMap {
	return template.FuncMap{
		"include": func(name string, data any) (string, error) {
			var buf bytes.Buffer
			err := root.ExecuteTemplate(&buf, name, data)
			return buf.String(), err
		},
		"toYaml": func(v any) (string, error) {
			var b strings.Builder
			if err := emit(&b, v, 0); err != nil {
				return "", err
			}
			return strings.TrimSuffix(b.String(), "\n"), nil
		},
		"indent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
		"nindent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
		"quote": func(v any) string {
			if v == nil {
				return `""`
			}
			return strconv.Quote(fmt.Sprint(v))
		},
		"default": func(d any, v ...any) any {
			if len(v) == 0 || empty(v[0]) {
				return d
			}
			return v[0]
		},
		"required": func(message string, v any) (any, error) {
			if v == nil {
				return nil, errors.New(message)
			}
			if s, ok := v.(string); ok && s == "" {
				return nil, errors.New(message)
			}
			return v, nil
		},
		"b64enc": func(s string) string {
			return base64.StdEncoding.EncodeToString([]byte(s))
		},
	}
}

var plain = regexp.MustCompile(`^[A-Za-z_/][A-Za-z0-9_./:@-]*$`)

// scalar writes a YAML scalar: plain when it cannot be read as anything but a string,
// double-quoted otherwise.
func scalar(v any) (string, error) {
	switch t := v.(type) {
	case nil:
		return "null", nil
	case bool:
		return strconv.FormatBool(t), nil
	case int64:
		return strconv.FormatInt(t, 10), nil
	case int:
		return strconv.Itoa(t), nil
	case float64:
		if math.IsInf(t, 0) || math.IsNaN(t) {
			return "", fmt.Errorf("toYaml: %v has no YAML form", t)
		}
		return strconv.FormatFloat(t, 'g', -1, 64), nil
	case string:
		switch strings.ToLower(t) {
		case "true", "false", "yes", "no", "on", "off", "y", "n", "null", "~":
			return strconv.Quote(t), nil
		}
		if plain.MatchString(t) {
			return t, nil
		}
		return strconv.Quote(t), nil
	default:
		return "", fmt.Errorf("toYaml: cannot write a %T", v)
	}
}

func emit(b *strings.Builder, v any, indent int) error {
	pad := strings.Repeat(" ", indent)
	switch t := v.(type) {
	case map[string]any:
		if len(t) == 0 {
			b.WriteString(pad + "{}\n")
			return nil
		}
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			key, err := scalar(k)
			if err != nil {
				return err
			}
			if err := entry(b, pad+key+":", t[k], indent); err != nil {
				return err
			}
		}
	case []any:
		if len(t) == 0 {
			b.WriteString(pad + "[]\n")
			return nil
		}
		for _, x := range t {
			if m, ok := x.(map[string]any); ok && len(m) > 0 {
				// "- " then the map's first line, the rest indented under it.
				var inner strings.Builder
				if err := emit(&inner, m, indent+2); err != nil {
					return err
				}
				b.WriteString(pad + "- " + strings.TrimPrefix(inner.String(), pad+"  "))
				continue
			}
			if err := entry(b, pad+"-", x, indent); err != nil {
				return err
			}
		}
	default:
		s, err := scalar(v)
		if err != nil {
			return err
		}
		b.WriteString(pad + s + "\n")
	}
	return nil
}

// entry writes `head value` for scalars and empty collections, else head and the nested block.
func entry(b *strings.Builder, head string, v any, indent int) error {
	switch t := v.(type) {
	case map[string]any:
		if len(t) > 0 {
			b.WriteString(head + "\n")
			return emit(b, t, indent+2)
		}
		b.WriteString(head + " {}\n")
		return nil
	case []any:
		if len(t) > 0 {
			b.WriteString(head + "\n")
			return emit(b, t, indent+2)
		}
		b.WriteString(head + " []\n")
		return nil
	}
	s, err := scalar(v)
	if err != nil {
		return err
	}
	b.WriteString(head + " " + s + "\n")
	return nil
}
