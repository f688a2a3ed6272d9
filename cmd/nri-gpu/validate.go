package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/nri-gpu/nri-gpu/pkg/config"
)

// runValidate checks plugin configuration files, printing each problem
// as FILE:LINE: message.
func runValidate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-gpu validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: nri-gpu validate FILE...\ncheck nri-gpu configuration files, printing each problem as FILE:LINE: message")
	}
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	code := exitOK
	for _, file := range fs.Args() {
		data, err := os.ReadFile(file)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", file, err)
			code = exitError
			continue
		}
		problems := config.Problems(data)
		for _, p := range problems {
			if p.Line > 0 {
				fmt.Fprintf(stderr, "%s:%d: %s\n", file, p.Line, p.Message)
			} else {
				fmt.Fprintf(stderr, "%s: %s\n", file, p.Message)
			}
		}
		if len(problems) > 0 {
			code = exitError
			continue
		}
		fmt.Fprintf(stdout, "%s: ok\n", file)
	}
	return code
}
