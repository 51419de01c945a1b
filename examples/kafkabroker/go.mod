module github.com/replog/replog/examples/kafkabroker

go 1.26.0

replace github.com/replog/replog => ../..

require (
	github.com/replog/replog v0.0.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
)

require (
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
