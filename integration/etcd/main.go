// etcd for the test cluster scripts/k8s runs on the stack: etcd's own server main, built
// from its module at the version go.mod pins (the go.etcd.io/etcd repository's
// server/main.go is this, and its module zip holds no cmd).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
