// Command mps-control is a stand-in for nvidia-cuda-mps-control on nodes
// without a GPU (internal/mpsstandin), for the end-to-end and cluster
// tests. Built static, it runs inside nri-gpu's image too.
package main

import (
	"os"

	"github.com/nri-gpu/nri-gpu/internal/mpsstandin"
)

func main() { os.Exit(mpsstandin.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
