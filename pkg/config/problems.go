package config

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Problem is one thing wrong with a configuration, at a line of it.
type Problem struct {
	// Line is the 1-based line the problem is at; 0 when unknown.
	Line int
	// Message says what is wrong, starting with the key.
	Message string
}

// String returns "line N: message".
func (p Problem) String() string {
	if p.Line == 0 {
		return p.Message
	}
	return fmt.Sprintf("line %d: %s", p.Line, p.Message)
}

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// Problems lists everything wrong with a configuration, each at its
// line: what Parse would reject, one problem at a time.
func Problems(data []byte) []Problem {
	c, unversioned, err := decode(data)
	if err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			var out []Problem
			for _, e := range te.Errors {
				out = append(out, lineProblem(e))
			}
			return out
		}
		return []Problem{lineProblem(err.Error())}
	}
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root)
	c.setDefaults()
	var out []Problem
	for _, e := range spelt(c.problems(), unversioned) {
		out = append(out, Problem{Line: lineOf(&root, strings.Split(e.Field, ".")), Message: describe(e)})
	}
	return out
}

func lineProblem(msg string) Problem {
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return Problem{Line: n, Message: m[2]}
	}
	return Problem{Message: msg}
}

// lineOf returns the line of the key at path in a YAML document, or 0.
// An element of path may index a list: "resources[0]".
func lineOf(n *yaml.Node, path []string) int {
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for i, elem := range path {
		key, index := elem, -1
		if k, rest, ok := strings.Cut(elem, "["); ok {
			if v, err := strconv.Atoi(strings.TrimSuffix(rest, "]")); err == nil {
				key, index = k, v
			}
		}
		if n.Kind != yaml.MappingNode {
			return 0
		}
		found := false
		for j := 0; j+1 < len(n.Content); j += 2 {
			if n.Content[j].Value == key {
				line := n.Content[j].Line
				n, found = n.Content[j+1], true
				if index >= 0 {
					if n.Kind != yaml.SequenceNode || index >= len(n.Content) {
						return 0
					}
					n = n.Content[index]
					line = n.Line
				}
				if i == len(path)-1 {
					return line
				}
				break
			}
		}
		if !found {
			return 0
		}
	}
	return 0
}
