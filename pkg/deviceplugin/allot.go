package deviceplugin

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nri-gpu/nri-gpu/pkg/policy"
)

// Allotting is a Source that must agree to what kubelet allocates.
type Allotting interface {
	// Allot is told the IDs kubelet allocates a pod it is admitting,
	// before the plugin answers: an error refuses the allocation (kubelet
	// fails the pod's admission with it), nil keeps them for that pod.
	Allot(ctx context.Context, ids []string) error
}

// refusal is an Allot refusal as Allocate answers it: the error itself
// in process, and over gRPC with a code that tells the relay what it is
// (FailedPrecondition: the admission denied it; Unavailable: nri-gpu
// could not tell yet).
type refusal struct{ err error }

func refused(err error) error { return refusal{err} }

func (r refusal) Error() string { return r.err.Error() }
func (r refusal) Unwrap() error { return r.err }

// GRPCStatus is the status gRPC answers with.
func (r refusal) GRPCStatus() *status.Status {
	code := codes.Unavailable
	if errors.Is(r.err, policy.ErrDenied) {
		code = codes.FailedPrecondition
	}
	return status.New(code, r.err.Error())
}

// errDeniedUpstream is wrapped by the relay's refusal of what nri-gpu's
// device plugin denied.
var errDeniedUpstream = errors.New("nri-gpu's device plugin refuses it")
