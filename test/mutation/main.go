// Command mutation runs gremlins (a mutation testing tool for Go) over
// nri-gpu's packages and writes the per-package report, docs/mutation.md:
// mutants killed, lived, not covered and timed out, and each package's
// score, killed / (killed + lived), timed-out mutants counted as killed
// and equivalent mutants (listed in test/mutation/equivalent.txt with the
// reason) left out. It exits 1 when a package is below its threshold.
//
// gremlins copies the module once per worker and runs each mutant's
// package tests there; to keep those copies small (no build outputs) and
// the run independent of edits made meanwhile, it runs in a copy of the
// files git knows (tracked, and untracked but not ignored) under /tmp.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

func main() {
	var (
		gremlins  = flag.String("gremlins", "gremlins", "the gremlins executable")
		out       = flag.String("out", "docs/mutation.md", "report to write")
		equiv     = flag.String("equivalent", "test/mutation/equivalent.txt", "equivalent mutants, with the reason")
		results   = flag.String("results", "_output/mutation", "directory of each package's gremlins output, kept between runs")
		threshold = flag.Float64("threshold", 85, "lowest score, in percent, of each package")
		workers   = flag.Int("workers", 0, "gremlins workers (0: one per CPU)")
		coeff     = flag.Int("timeout-coefficient", 20, "gremlins' timeout: this times the coverage run's")
		only      = flag.String("only", "", "comma-separated packages to run again; the others' last results are reused")
		own       = flag.Bool("own", true, "run nri-gpu's own mutants too (an error returned as nil, a continue or break deleted, an integer constant one off, true and false swapped)")
		sample    = flag.Int("own-sample", 0, "run this many of each package's own mutants, chosen at random with a fixed seed (0: all)")
		noGrem    = flag.Bool("no-gremlins", false, "run nri-gpu's own mutants only; gremlins' last results are reused")
	)
	flag.Parse()
	pkgs := flag.Args() // relative to the module root
	o := options{own: *own, sample: *sample, gremlins: !*noGrem}
	if err := run(*gremlins, *out, *equiv, *results, *only, *threshold, *workers, *coeff, pkgs, o); err != nil {
		fmt.Fprintln(os.Stderr, "mutation:", err)
		os.Exit(1)
	}
}

// options are what a run runs beside gremlins.
type options struct {
	own, gremlins bool
	sample        int
}

func run(gremlins, out, equivFile, results, only string, threshold float64, workers, coeff int, pkgs []string, o options) error {
	equivalents, err := readEquivalents(equivFile)
	if err != nil {
		return err
	}
	todo := pkgs
	if only != "" {
		todo = strings.Split(only, ",")
	}
	if err := os.MkdirAll(results, 0o755); err != nil {
		return err
	}
	start := time.Now()
	root, err := snapshot()
	defer os.RemoveAll(root)
	if err != nil {
		return err
	}
	for _, pkg := range todo {
		if !slices.Contains(pkgs, pkg) {
			return fmt.Errorf("%s is not one of the packages %v", pkg, pkgs)
		}
		// A package's subpackages that are listed too are run on their own.
		var exclude []string
		for _, sub := range pkgs {
			if rel, ok := strings.CutPrefix(sub, pkg+"/"); ok {
				exclude = append(exclude, "^"+regexp.QuoteMeta(rel)+"/")
			}
		}
		if o.gremlins {
			raw, err := unleash(gremlins, root, pkg, exclude, workers, coeff)
			if err != nil {
				return fmt.Errorf("%s: %w", pkg, err)
			}
			if err := keep(resultFile(results, pkg), raw, filepath.Join(root, pkg)); err != nil {
				return fmt.Errorf("%s: %w", pkg, err)
			}
		}
		if o.own {
			raw, err := unleashOwn(root, pkg, o.sample, 10*time.Minute)
			if err != nil {
				return fmt.Errorf("%s: own mutants: %w", pkg, err)
			}
			if err := keep(ownResultFile(results, pkg), raw, filepath.Join(root, pkg)); err != nil {
				return fmt.Errorf("%s: %w", pkg, err)
			}
		}
	}
	rep := &report{pkgs: map[string]*stats{}, lived: map[string][]mutant{}, equivalents: equivalents}
	var failed []string
	for _, pkg := range pkgs {
		found := false
		for _, file := range []string{resultFile(results, pkg), ownResultFile(results, pkg)} {
			raw, err := os.ReadFile(file)
			if err != nil {
				continue
			}
			var k kept
			if err := json.Unmarshal(raw, &k); err != nil {
				return fmt.Errorf("%s: kept results %s: %w", pkg, file, err)
			}
			rep.add(k, pkg)
			found = true
		}
		if !found {
			return fmt.Errorf("%s: no results (run it: -only %s)", pkg, pkg)
		}
		switch s := rep.pkgs[pkg]; {
		case s == nil:
			failed = append(failed, pkg+" (no mutants)")
		case s.score() < threshold:
			failed = append(failed, fmt.Sprintf("%s %.1f%%", pkg, s.score()))
		}
	}
	ran := "every package"
	if len(todo) < len(pkgs) {
		ran = strings.Join(todo, ", ") + " (the others' results kept from an earlier run)"
	}
	doc := rep.markdown(threshold, ran, time.Since(start))
	if err := os.WriteFile(out, []byte(doc), 0o644); err != nil {
		return err
	}
	fmt.Print(doc)
	if len(failed) > 0 {
		return fmt.Errorf("below %.0f%%: %s", threshold, strings.Join(failed, ", "))
	}
	return nil
}

func resultFile(dir, pkg string) string {
	return filepath.Join(dir, strings.ReplaceAll(pkg, "/", "_")+".json")
}

// ownResultFile is where the results of nri-gpu's own mutants of pkg are
// kept.
func ownResultFile(dir, pkg string) string {
	return filepath.Join(dir, strings.ReplaceAll(pkg, "/", "_")+".own.json")
}

// kept is a package's result as kept between runs: gremlins' output and
// the source of the files it mutated as they were then, so that a report
// that reuses it quotes the lines that were measured.
type kept struct {
	Result  result            `json:"result"`
	Sources map[string]string `json:"sources"` // by gremlins' file name
}

// keep writes to file gremlins' output raw of a run in dir, with the
// sources of the files it names.
func keep(file string, raw []byte, dir string) error {
	k := kept{Sources: map[string]string{}}
	if err := json.Unmarshal(raw, &k.Result); err != nil {
		return fmt.Errorf("gremlins output: %w", err)
	}
	for _, f := range k.Result.Files {
		data, err := os.ReadFile(filepath.Join(dir, f.FileName))
		if err != nil {
			return err
		}
		k.Sources[f.FileName] = string(data)
	}
	data, err := json.Marshal(k)
	if err != nil {
		return err
	}
	return os.WriteFile(file, data, 0o644)
}

// snapshot copies the files git knows into a new directory under /tmp.
func snapshot() (string, error) {
	list, err := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return "", fmt.Errorf("git ls-files: %w", err)
	}
	dir, err := os.MkdirTemp("/tmp", "nri-gpu-mutation-")
	if err != nil {
		return "", err
	}
	for _, name := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		info, err := os.Lstat(name)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or a link
		}
		if err := copyFile(name, filepath.Join(dir, name), info.Mode()); err != nil {
			return dir, err
		}
	}
	return dir, nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	o, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode.Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(o, in); err != nil {
		o.Close()
		return err
	}
	return o.Close()
}

// unleash runs gremlins in root on pkg, files matching exclude left out,
// and returns its JSON output.
func unleash(gremlins, root, pkg string, exclude []string, workers, coeff int) ([]byte, error) {
	bin, err := filepath.Abs(gremlins)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath(gremlins); err != nil {
			return nil, err
		}
	}
	jsonOut := filepath.Join(root, "mutation.json")
	args := []string{"unleash",
		// Beyond gremlins' defaults (boundaries, negated conditions,
		// arithmetic, ++/--, negatives): && and || swapped, break and
		// continue swapped.
		"--invert-logical", "--invert-loopctrl",
		"--timeout-coefficient", fmt.Sprint(coeff),
		"--output", jsonOut,
	}
	if workers > 0 {
		args = append(args, "--workers", fmt.Sprint(workers))
	}
	for _, e := range exclude {
		args = append(args, "--exclude-files", e)
	}
	cmd := exec.Command(bin, append(args, "./"+pkg)...)
	cmd.Dir = root
	// gremlins times each mutant's tests against its coverage run: a
	// cached one would take no time and time every mutant out.
	cmd.Env = append(os.Environ(), "GOFLAGS=-count=1")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("gremlins: %w", err)
	}
	return os.ReadFile(jsonOut)
}

// result is gremlins' JSON output, as much of it as is read here.
type result struct {
	Files []fileResult `json:"files"`
}

// fileResult is the mutants of one file.
type fileResult struct {
	FileName  string     `json:"file_name"`
	Mutations []mutation `json:"mutations"`
}

// mutation is one mutant and what became of it.
type mutation struct {
	Line   int    `json:"line"`
	Column int    `json:"column"`
	Type   string `json:"type"`
	Status string `json:"status"`
}

// equivalent is a mutant that cannot change behaviour, found by its file,
// mutator and source line (not its line number, which moves with edits).
type equivalent struct {
	file, mutator, source, reason string
	used                          bool
}

// readEquivalents reads lines "file | MUTATOR | source line | reason",
// MUTATOR@COLUMN where a line has two mutants of a kind; blank lines and
// lines starting with # are skipped.
func readEquivalents(file string) ([]*equivalent, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []*equivalent
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, " | ")
		if len(f) != 4 || f[3] == "" {
			return nil, fmt.Errorf("%s:%d: want \"file | MUTATOR | source line | reason\"", file, n)
		}
		out = append(out, &equivalent{file: f[0], mutator: f[1], source: f[2], reason: f[3]})
	}
	return out, sc.Err()
}

// stats are one package's mutants by status.
type stats struct {
	killed, lived, notCovered, timedOut, notViable, equivalent int
}

// score is killed (timed out included) over killed and lived, equivalent
// mutants left out, in percent.
func (s stats) score() float64 {
	k := s.killed + s.timedOut
	if k+s.lived == 0 {
		return 100
	}
	return 100 * float64(k) / float64(k+s.lived)
}

// mutant is one that lived, for the report.
type mutant struct {
	pos, mutator, source string
}

type report struct {
	pkgs        map[string]*stats
	lived       map[string][]mutant
	equivalents []*equivalent
}

// add counts the mutants of one kept run on pkg, whose file names are
// relative to pkg.
func (r *report) add(k kept, pkg string) {
	for _, f := range k.Result.Files {
		file := filepath.ToSlash(filepath.Join(pkg, f.FileName))
		dir := filepath.ToSlash(filepath.Dir(file))
		if r.pkgs[dir] == nil {
			r.pkgs[dir] = &stats{}
		}
		s := r.pkgs[dir]
		lines := strings.Split(k.Sources[f.FileName], "\n")
		for _, m := range f.Mutations {
			src := ""
			if m.Line > 0 && m.Line <= len(lines) {
				src = strings.TrimSpace(lines[m.Line-1])
			}
			switch m.Status {
			case "KILLED":
				s.killed++
			case "TIMED OUT":
				s.timedOut++
			case "NOT COVERED":
				s.notCovered++
			case "NOT VIABLE":
				s.notViable++
			case "LIVED":
				i := slices.IndexFunc(r.equivalents, func(e *equivalent) bool {
					mutator, col, _ := strings.Cut(e.mutator, "@")
					return e.file == file && mutator == m.Type && e.source == src && (col == "" || col == fmt.Sprint(m.Column))
				})
				if i >= 0 {
					r.equivalents[i].used = true
					s.equivalent++
					continue
				}
				s.lived++
				r.lived[dir] = append(r.lived[dir], mutant{fmt.Sprintf("%s:%d:%d", filepath.Base(file), m.Line, m.Column), m.Type, src})
			}
		}
	}
}

func (r *report) markdown(threshold float64, ran string, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Mutation testing\n\nWritten by `make mutation` on %s, running %s in %s (gremlins, every mutator it has on by default plus `--invert-logical` and `--invert-loopctrl`; and nri-gpu's own mutators for what gremlins does not do, `test/mutation/own.go`: ERROR_TO_NIL, an error a function returns replaced by nil; LOOPCTRL_DELETED, a continue or break deleted; INT_OFF_BY_ONE, an integer constant one more; BOOL_SWAPPED, true and false swapped; each mutant's package tests, the protocol tests on NRI's runtime side included). Score: killed / (killed + lived), timed-out mutants counted as killed, equivalent mutants (`test/mutation/equivalent.txt`, each with its reason) left out. Not covered: mutants in code no test of the package runs (gremlins also counts a switch case's condition as not covered, since Go's coverage blocks start after its colon). Each package is held to %.0f%%. The line numbers are those of the run.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), ran, took.Round(time.Second), threshold)
	b.WriteString("| package | mutants | killed | timed out | lived | equivalent | not covered | score |\n|---|---|---|---|---|---|---|---|\n")
	pkgs := make([]string, 0, len(r.pkgs))
	for p := range r.pkgs {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	for _, p := range pkgs {
		s := r.pkgs[p]
		name := p
		total := s.killed + s.timedOut + s.lived + s.equivalent + s.notCovered
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %.1f%% |\n", name, total, s.killed, s.timedOut, s.lived, s.equivalent, s.notCovered, s.score())
	}
	b.WriteString("\n## Mutants that lived\n\n")
	for _, p := range pkgs {
		if len(r.lived[p]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s:\n\n", p)
		for _, m := range r.lived[p] {
			fmt.Fprintf(&b, "- %s %s: `%s`\n", m.pos, m.mutator, m.source)
		}
		b.WriteString("\n")
	}
	b.WriteString("## Equivalent mutants\n\nMutants no test can kill, because the program behaves the same with them:\n\n")
	for _, e := range r.equivalents {
		state := ""
		if !e.used {
			state = " (not met in this run)"
		}
		fmt.Fprintf(&b, "- %s %s `%s`: %s%s\n", e.file, e.mutator, e.source, e.reason, state)
	}
	return b.String()
}
