// Command etcd is etcd's server, built for nri-gpu's cluster tests at the
// version Kubernetes lists in its go.mod.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
