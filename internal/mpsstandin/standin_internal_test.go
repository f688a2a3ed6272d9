package mpsstandin

import (
	"os"
	"os/exec"
	"testing"

	"github.com/nri-gpu/nri-gpu/pkg/mps"
)

// TestControlSocket: the stand-in listens where nri-gpu's MPS client
// looks.
func TestControlSocket(t *testing.T) {
	if controlSocket != mps.ControlSocket {
		t.Errorf("the stand-in listens on %q, pkg/mps looks for %q", controlSocket, mps.ControlSocket)
	}
}

// TestBuildsStatic: the stand-in builds without cgo, as the image on the
// cluster needs it.
func TestBuildsStatic(t *testing.T) {
	build := exec.Command("go", "build", "-o", os.DevNull, "github.com/nri-gpu/nri-gpu/test/tools/mps-control")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build ./test/tools/mps-control: %v\n%s", err, out)
	}
}
