package config

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestLineOf: the line of a key path in a YAML document, or 0 where the
// path leads nowhere; the document node or its top mapping will do.
func TestLineOf(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("a: 1\nb:\n  c: 2\n  d:\n    - x: 3\n    - y: 4\n"), &doc); err != nil {
		t.Fatal(err)
	}
	var empty yaml.Node
	if err := yaml.Unmarshal([]byte("# nothing\n"), &empty); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		node *yaml.Node
		path string
		want int
	}{
		{&doc, "a", 1},
		{&doc, "b.c", 3},
		{&doc, "b.d", 4},
		{&doc, "b.d[1]", 6},
		{&doc, "b.d[1].y", 6},
		{&doc, "b.d[2].y", 0},
		{&doc, "b.c[0]", 0},
		{&doc, "b.e", 0},
		{&doc, "a.b", 0},
		{&doc, "b[x].c", 0},
		{doc.Content[0], "b.c", 3},
		{&empty, "a", 0},
		{&yaml.Node{Kind: yaml.DocumentNode}, "a", 0},
	}
	for _, tc := range tests {
		if got := lineOf(tc.node, strings.Split(tc.path, ".")); got != tc.want {
			t.Errorf("lineOf(%s) = %d, want %d", tc.path, got, tc.want)
		}
	}
}
