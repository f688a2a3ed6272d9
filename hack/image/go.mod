// Module image builds nri-gpu's OCI image (make image), with
// go-containerregistry; kept out of nri-gpu's own go.mod.
module github.com/nri-gpu/nri-gpu/hack/image

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
