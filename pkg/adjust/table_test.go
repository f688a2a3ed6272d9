package adjust_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/adjust"
)

// editsTable is the table of docs/container.md that says what nri-gpu
// does with each edit, per runtime.
const editsTable = "| edit | containerd 2.x | containerd 1.7 and unknown runtimes |"

// tableEdits are the edits of each row of the table, as a device's.
var tableEdits = map[string]string{
	"device nodes, mounts, env":          `{deviceNodes: [{path: /dev/x, hostPath: /dev/null}], mounts: [{hostPath: /etc/hostname, containerPath: /x, options: [ro, bind]}], env: [X=1]}`,
	"hooks":                              `{hooks: [{hookName: createContainer, path: /bin/true}]}`,
	"default device permissions (`rwm`)": `{deviceNodes: [{path: /dev/x, hostPath: /dev/null}]}`,
	"device permissions narrower than `rw` (`r`, `none`)":    `{deviceNodes: [{path: /dev/x, hostPath: /dev/null, permissions: r}]}`,
	"`intelRdt` with a CLOS, schemata, monitoring":           `{intelRdt: {closID: gold, schemata: ["L2:0=ff"], enableMonitoring: true}}`,
	"`intelRdt` with an L3 cache or memory bandwidth schema": `{intelRdt: {closID: gold, l3CacheSchema: "L3:0=ff"}}`,
	"`netDevices`":     `{netDevices: [{hostInterfaceName: eth9, name: net0}]}`,
	"`additionalGids`": `{additionalGids: [44]}`,
}

// TestEditsTable checks the table of docs/container.md against what Build
// does: each cell starts with what happens to the edit on that runtime
// ("applied", "narrowed" by NRI, "refused", or "left out" for a root
// process and refused otherwise), and every row is one the test knows.
func TestEditsTable(t *testing.T) {
	data, err := os.ReadFile("../../docs/container.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(data), editsTable+"\n")
	if !ok {
		t.Fatalf("docs/container.md has no table %q", editsTable)
	}
	runtimes := []adjust.Runtime{adjust.RuntimeOf("containerd", "v2.3.7", "v0.12.5"), adjust.RuntimeOf("containerd", "1.7.35", "v0.8.0")}
	seen := map[string]bool{}
	for _, line := range strings.Split(table, "\n")[1:] { // past the |---| line
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 3 {
			t.Fatalf("row %q has %d cells", line, len(cells))
		}
		row := strings.TrimSpace(cells[0])
		edits, known := tableEdits[row]
		if !known {
			t.Errorf("row %q: no edits for it in this test", row)
			continue
		}
		seen[row] = true
		for i, rt := range runtimes {
			cell := strings.TrimSpace(cells[i+1])
			if strings.HasPrefix(cell, "the same") {
				cell = strings.TrimSpace(cells[1])
			}
			t.Run(row+"/"+rt.Version, func(t *testing.T) {
				spec := "cdiVersion: \"1.1.0\"\nkind: example.com/edit\ndevices:\n  - name: x\n    containerEdits: " + edits + "\n"
				root, rootErr := build(t, map[string]string{"edit.yaml": spec}, adjust.Options{Runtime: rt}, "example.com/edit=x")
				_, userErr := build(t, map[string]string{"edit.yaml": spec}, adjust.Options{Runtime: rt, UID: 1000, GID: 1000}, "example.com/edit=x")
				switch {
				case strings.HasPrefix(cell, "applied"), strings.HasPrefix(cell, "narrowed"):
					if rootErr != nil || len(root.Skipped)+len(root.Unneeded) > 0 {
						t.Errorf("the table says %q; Build: %v, %+v", cell, rootErr, root)
					}
				case strings.HasPrefix(cell, "refused"):
					if !errors.Is(rootErr, adjust.ErrUnsupportedEdit) {
						t.Errorf("the table says %q; Build: %v", cell, rootErr)
					}
				case strings.HasPrefix(cell, "left out"):
					if rootErr != nil || len(root.Unneeded) == 0 || !errors.Is(userErr, adjust.ErrUnsupportedEdit) {
						t.Errorf("the table says %q; Build for root: %v, %+v; for another user: %v", cell, rootErr, root, userErr)
					}
				default:
					t.Errorf("cell %q starts with no known outcome", cell)
				}
			})
		}
	}
	for row := range tableEdits {
		if !seen[row] {
			t.Errorf("docs/container.md has no row %q", row)
		}
	}
}
