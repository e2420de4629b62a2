package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"
)

// api is kube-apiserver's REST API as an admin with a bearer token, over its own HTTP/2
// connection (the server's certificate is not checked: it is the apiserver's self-signed one).
type api struct {
	base, token string
	http        *http.Client
}

func newAPI(base, token string) *api {
	transport := &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 64,
	}
	return &api{base: base, token: token, http: &http.Client{Transport: transport}}
}

// statusError is an answer other than 2xx.
type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string { return fmt.Sprintf("HTTP %d: %.300s", e.code, e.body) }

// isConflict says whether err is a 409 (a stale resourceVersion).
func isConflict(err error) bool {
	se, ok := err.(*statusError)
	return ok && se.code == http.StatusConflict
}

// do sends method path with body (JSON, if not nil) and decodes a 2xx answer into out (if not
// nil).
func (a *api) do(ctx context.Context, method, path string, body, out any) error {
	var reader io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		reader = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, reader)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		text, _ := io.ReadAll(resp.Body)
		return &statusError{code: resp.StatusCode, body: string(text)}
	}
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// meta is the part of an object's metadata the load uses.
type meta struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace,omitempty"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
}

// loadLabel marks the load's objects (kube-apiserver keeps ConfigMaps of its own in kube-system).
const loadLabel = "concord-load"

// configMap is a ConfigMap with the fields the load sets: `blob` (the object's bulk) and
// `stamp` (when the write carrying it was sent, for watch delivery latency).
type configMap struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   meta              `json:"metadata"`
	Data       map[string]string `json:"data"`
}

func newConfigMap(ns, name, rv, blob string) *configMap {
	return &configMap{APIVersion: "v1", Kind: "ConfigMap",
		Metadata: meta{Name: name, Namespace: ns, ResourceVersion: rv, Labels: map[string]string{loadLabel: "1"}},
		Data:     map[string]string{"blob": blob, "stamp": strconv.FormatInt(time.Now().UnixNano(), 10)}}
}

// stamped is when the write that carries cm was sent.
func stamped(cm *configMap) (time.Time, bool) {
	ns, err := strconv.ParseInt(cm.Data["stamp"], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// createConfigMap creates ns/name and returns its resourceVersion.
func (a *api) createConfigMap(ctx context.Context, ns, name, blob string) (string, error) {
	var got configMap
	err := a.do(ctx, http.MethodPost, "/api/v1/namespaces/"+ns+"/configmaps", newConfigMap(ns, name, "", blob), &got)
	return got.Metadata.ResourceVersion, err
}

// updateConfigMap replaces ns/name if it is still at resourceVersion rv (kube-apiserver's
// GuaranteedUpdate with a precondition) and returns the new resourceVersion.
func (a *api) updateConfigMap(ctx context.Context, ns, name, rv, blob string) (string, error) {
	var got configMap
	err := a.do(ctx, http.MethodPut, "/api/v1/namespaces/"+ns+"/configmaps/"+name, newConfigMap(ns, name, rv, blob), &got)
	return got.Metadata.ResourceVersion, err
}

// getConfigMap reads ns/name.
func (a *api) getConfigMap(ctx context.Context, ns, name string) (*configMap, error) {
	var got configMap
	err := a.do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/configmaps/"+name, nil, &got)
	return &got, err
}

// listPage is one page of a list: its items' metadata and where the next page starts.
type listPage struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []struct {
		Metadata meta `json:"metadata"`
	} `json:"items"`
}

// listAll reads every ConfigMap of the load in namespace ns (of every namespace if ns is "")
// in pages of `limit` (`limit` and `continue`, as kubectl and informers list; with a label
// selector, which kube-apiserver applies to what it reads) and returns their metadata and the
// list's resourceVersion (the first page's, to which the others are pinned).
func (a *api) listAll(ctx context.Context, ns string, limit int64) ([]meta, string, error) {
	var all []meta
	rv, cont := "", ""
	prefix := "/api/v1/configmaps"
	if ns != "" {
		prefix = "/api/v1/namespaces/" + ns + "/configmaps"
	}
	for {
		path := prefix + "?labelSelector=" + loadLabel + "&limit=" + strconv.FormatInt(limit, 10)
		if cont != "" {
			path += "&continue=" + url.QueryEscape(cont)
		}
		var page listPage
		if err := a.do(ctx, http.MethodGet, path, nil, &page); err != nil {
			return all, rv, err
		}
		if rv == "" {
			rv = page.Metadata.ResourceVersion
		}
		for _, it := range page.Items {
			all = append(all, it.Metadata)
		}
		if page.Metadata.Continue == "" {
			return all, rv, nil
		}
		cont = page.Metadata.Continue
	}
}

// createEvent records an Event about ns/object; kube-apiserver stores it under a lease of
// its --event-ttl, reusing one lease for the Events of a short window.
func (a *api) createEvent(ctx context.Context, ns, name, object string) error {
	now := time.Now().UTC().Format(time.RFC3339)
	event := map[string]any{
		"apiVersion": "v1", "kind": "Event",
		"metadata":       map[string]any{"name": name, "namespace": ns},
		"involvedObject": map[string]any{"kind": "ConfigMap", "namespace": ns, "name": object, "apiVersion": "v1"},
		"reason":         "Updated", "message": "updated by the load", "type": "Normal",
		"firstTimestamp": now, "lastTimestamp": now, "count": 1,
		"source": map[string]any{"component": "apiserver-load"},
	}
	return a.do(ctx, http.MethodPost, "/api/v1/namespaces/"+ns+"/events", event, nil)
}

// cpuProfile writes kube-apiserver's CPU profile over the next `length` (its
// /debug/pprof/profile, on by default with --profiling) to path.
func (a *api) cpuProfile(ctx context.Context, length time.Duration, path string) error {
	seconds := int(length.Seconds())
	if seconds < 1 {
		seconds = 1
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		a.base+"/debug/pprof/profile?seconds="+strconv.Itoa(seconds), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &statusError{code: resp.StatusCode, body: string(body)}
	}
	return os.WriteFile(path, body, 0o644)
}
