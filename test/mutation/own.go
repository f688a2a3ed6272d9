package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// nri-gpu's own mutators: the mistakes gremlins does not make, each of
// which a test should catch.
const (
	// ErrorToNil replaces the error a function returns (its last result,
	// of type error) by nil: a failure taken as success.
	ErrorToNil = "ERROR_TO_NIL"
	// LoopCtrlDeleted deletes a continue or a break.
	LoopCtrlDeleted = "LOOPCTRL_DELETED"
	// IntOffByOne adds one to an integer constant.
	IntOffByOne = "INT_OFF_BY_ONE"
	// BoolSwapped swaps true and false.
	BoolSwapped = "BOOL_SWAPPED"
)

// ownMutant is one change to one file: bytes [start, end) replaced.
type ownMutant struct {
	file       string // relative to the package
	line, col  int
	kind       string
	start, end int
	with       string
	// coverLine and coverCol are where its coverage is read: its own
	// position, or for a case's expression its switch's (Go's coverage
	// blocks start after a case's colon).
	coverLine, coverCol int
}

// ownMutants returns the mutants of the package's non-test files in dir.
func ownMutants(dir string) ([]ownMutant, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []ownMutant
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		// The expressions of case clauses, by their range, and the
		// switch each belongs to.
		type caseList struct{ from, to, sw token.Pos }
		var cases []caseList
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			switch n := n.(type) {
			case *ast.SwitchStmt:
				body = n.Body
			case *ast.TypeSwitchStmt:
				body = n.Body
			default:
				return true
			}
			for _, c := range body.List {
				if cc, ok := c.(*ast.CaseClause); ok && len(cc.List) > 0 {
					cases = append(cases, caseList{cc.List[0].Pos(), cc.List[len(cc.List)-1].End(), n.Pos()})
				}
			}
			return true
		})
		// The other results of a return of an error, which callers do
		// not look at: no constant there is mutated.
		var dontCare [][2]token.Pos
		add := func(n ast.Node, kind, with string) {
			if kind == IntOffByOne || kind == BoolSwapped {
				for _, r := range dontCare {
					if n.Pos() >= r[0] && n.End() <= r[1] {
						return
					}
				}
			}
			p, q := fset.Position(n.Pos()), fset.Position(n.End())
			cover := p
			for _, c := range cases {
				if n.Pos() >= c.from && n.End() <= c.to {
					cover = fset.Position(c.sw)
				}
			}
			out = append(out, ownMutant{file: name, line: p.Line, col: p.Column, kind: kind, start: p.Offset, end: q.Offset, with: with, coverLine: cover.Line, coverCol: cover.Column})
		}
		// The functions whose last result is an error, innermost last.
		var erring []bool
		var visit func(n ast.Node) bool
		visit = func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				erring = append(erring, returnsError(n.Type))
				if n.Body != nil {
					ast.Inspect(n.Body, visit)
				}
				erring = erring[:len(erring)-1]
				return false
			case *ast.FuncLit:
				erring = append(erring, returnsError(n.Type))
				ast.Inspect(n.Body, visit)
				erring = erring[:len(erring)-1]
				return false
			case *ast.ReturnStmt:
				if len(erring) > 0 && erring[len(erring)-1] && len(n.Results) > 0 {
					if last := n.Results[len(n.Results)-1]; !isNil(last) {
						add(last, ErrorToNil, "nil")
						if len(n.Results) > 1 {
							dontCare = append(dontCare, [2]token.Pos{n.Results[0].Pos(), n.Results[len(n.Results)-2].End()})
						}
					}
				}
			case *ast.BranchStmt:
				if n.Tok == token.CONTINUE || n.Tok == token.BREAK {
					add(n, LoopCtrlDeleted, "")
				}
			case *ast.BasicLit:
				if n.Kind == token.INT {
					add(n, IntOffByOne, "("+n.Value+"+1)")
				}
			case *ast.Ident:
				switch n.Name {
				case "true":
					add(n, BoolSwapped, "false")
				case "false":
					add(n, BoolSwapped, "true")
				}
			case *ast.GenDecl:
				// Constants of a const block are a declaration's, not
				// logic (an iota's values, a version): left alone.
				if n.Tok == token.CONST {
					return false
				}
			}
			return true
		}
		for _, d := range f.Decls {
			ast.Inspect(d, visit)
		}
	}
	return out, nil
}

func returnsError(t *ast.FuncType) bool {
	if t.Results == nil || len(t.Results.List) == 0 {
		return false
	}
	id, ok := t.Results.List[len(t.Results.List)-1].Type.(*ast.Ident)
	return ok && id.Name == "error"
}

func isNil(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "nil"
}

// covered reads a coverage profile and reports whether a position of a
// file of the package (by base name) is in a block the tests ran.
func covered(profile string) (func(file string, line, col int) bool, error) {
	f, err := os.Open(profile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type block struct{ l0, c0, l1, c1 int }
	run := map[string][]block{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// name.go:L0.C0,L1.C1 statements count
		line := sc.Text()
		colon := strings.LastIndex(line, ":")
		if colon < 0 || strings.HasPrefix(line, "mode:") {
			continue
		}
		fields := strings.Fields(line[colon+1:])
		if len(fields) != 3 || fields[2] == "0" {
			continue
		}
		var b block
		if _, err := fmt.Sscanf(fields[0], "%d.%d,%d.%d", &b.l0, &b.c0, &b.l1, &b.c1); err != nil {
			continue
		}
		name := filepath.Base(line[:colon])
		run[name] = append(run[name], b)
	}
	return func(file string, line, col int) bool {
		for _, b := range run[file] {
			after := line > b.l0 || (line == b.l0 && col >= b.c0)
			before := line < b.l1 || (line == b.l1 && col <= b.c1)
			if after && before {
				return true
			}
		}
		return false
	}, sc.Err()
}

// unleashOwn runs nri-gpu's own mutants of pkg in root (a copy of the
// module), a sample of them when sample > 0 (seeded: the same every
// run), each with the package's tests, and returns the result in the
// shape gremlins writes it.
func unleashOwn(root, pkg string, sample int, timeout time.Duration) ([]byte, error) {
	dir := filepath.Join(root, pkg)
	mutants, err := ownMutants(dir)
	if err != nil {
		return nil, err
	}
	if sample > 0 && sample < len(mutants) {
		r := rand.New(rand.NewPCG(1, uint64(len(mutants))))
		r.Shuffle(len(mutants), func(i, j int) { mutants[i], mutants[j] = mutants[j], mutants[i] })
		mutants = mutants[:sample]
	}
	profile := filepath.Join(root, "own-cover.out")
	start := time.Now()
	if out, err := goTest(root, pkg, timeout, "-coverprofile", profile); err != nil {
		return nil, fmt.Errorf("the tests fail unmutated: %w\n%s", err, out)
	}
	// Each mutant may take five times the coverage run's time (which
	// builds the tests, as each mutant's run does), and at least 30 s: a
	// mutant that loops for ever (a loop's break deleted) costs that, not
	// minutes.
	each := max(time.Since(start)*5, 30*time.Second)
	isCovered, err := covered(profile)
	if err != nil {
		return nil, err
	}
	var res result
	byFile := map[string]int{}
	for i, m := range mutants {
		status := "NOT COVERED"
		if isCovered(m.file, m.coverLine, m.coverCol) {
			status, err = tryMutant(root, pkg, m, each)
			if err != nil {
				return nil, err
			}
		}
		fmt.Fprintf(os.Stderr, "own mutant %d/%d %s:%d:%d %s: %s\n", i+1, len(mutants), m.file, m.line, m.col, m.kind, status)
		j, ok := byFile[m.file]
		if !ok {
			j = len(res.Files)
			byFile[m.file] = j
			res.Files = append(res.Files, fileResult{FileName: m.file})
		}
		res.Files[j].Mutations = append(res.Files[j].Mutations, mutation{m.line, m.col, m.kind, status})
	}
	return json.Marshal(res)
}

// tryMutant applies m, runs the package's tests and restores the file:
// KILLED when they fail, LIVED when they pass, TIMED OUT past timeout,
// NOT VIABLE when the mutant does not build.
func tryMutant(root, pkg string, m ownMutant, timeout time.Duration) (string, error) {
	path := filepath.Join(root, pkg, m.file)
	orig, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	mutated := string(orig[:m.start]) + m.with + string(orig[m.end:])
	if err := os.WriteFile(path, []byte(mutated), 0o644); err != nil {
		return "", err
	}
	defer os.WriteFile(path, orig, 0o644)
	build := exec.Command("go", "test", "-count=1", "-run", "^$", "./"+pkg)
	build.Dir = root
	if build.Run() != nil {
		return "NOT VIABLE", nil
	}
	_, err = goTest(root, pkg, timeout)
	switch {
	case err == nil:
		return "LIVED", nil
	case err == context.DeadlineExceeded:
		return "TIMED OUT", nil
	}
	return "KILLED", nil
}

// goTest runs the package's tests in root, with args, within timeout.
func goTest(root, pkg string, timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append(append([]string{"test", "-count=1", "-timeout", strconv.Itoa(int(timeout.Seconds())) + "s"}, args...), "./"+pkg)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return out, context.DeadlineExceeded
	}
	return out, err
}
