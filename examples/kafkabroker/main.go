// Command kafkabroker is a single-node Kafka broker on top of replog's logs,
// for unmodified Kafka clients. See README.md.
//
//	go run . [-listen 127.0.0.1:9092] [-data DIR] [-partitions N] [-v]
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/replog/replog/examples/kafkabroker/broker"
)

func main() {
	listen := flag.String("listen", broker.DefaultAddr, "TCP address to listen on")
	data := flag.String("data", "", "data directory (default: a temporary directory, removed at exit)")
	partitions := flag.Int("partitions", broker.DefaultPartitions, "partition count of topics created on demand")
	verbose := flag.Bool("v", false, "log rejected requests and connections closed on an error")
	flag.Parse()
	if err := run(*listen, *data, *partitions, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "kafkabroker:", err)
		os.Exit(1)
	}
}

func run(listen, data string, partitions int, verbose bool) error {
	if data == "" {
		tmp, err := os.MkdirTemp("", "replog-kafkabroker-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		data = tmp
	}
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	b, err := broker.Start(broker.Config{Addr: listen, DataDir: data, Partitions: partitions, Logger: logger})
	if err != nil {
		return err
	}
	logger.Info("serving Kafka clients", "addr", b.Addr().String(), "data", data, "partitions", partitions)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	logger.Info("shutting down")
	return b.Close()
}
