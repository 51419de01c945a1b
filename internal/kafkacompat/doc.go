// Package kafkacompat holds interoperability tests between replog and
// Kafka client libraries.
package kafkacompat
