package compression

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCodecString(t *testing.T) {
	tests := []struct {
		c    Codec
		want string
	}{
		{None, "none"},
		{Gzip, "gzip"},
		{Snappy, "snappy"},
		{LZ4, "lz4"},
		{Zstd, "zstd"},
		{Codec(5), "codec(5)"},
		{Codec(-1), "codec(-1)"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.c.String())
	}
}

func TestCodecIDsMatchKafka(t *testing.T) {
	// Kafka's record batch attributes, bits 0-2.
	assert.EqualValues(t, 0, None)
	assert.EqualValues(t, 1, Gzip)
	assert.EqualValues(t, 2, Snappy)
	assert.EqualValues(t, 3, LZ4)
	assert.EqualValues(t, 4, Zstd)
	assert.EqualValues(t, 0x07, AttributesMask)
}

func TestParseCodec(t *testing.T) {
	tests := []struct {
		name    string
		want    Codec
		wantErr error
	}{
		{"none", None, nil},
		{"uncompressed", None, nil},
		{"gzip", Gzip, nil},
		{"GZIP", Gzip, nil},
		{" snappy ", Snappy, nil},
		{"lz4", LZ4, nil},
		{"Zstd", Zstd, nil},
		{"", None, ErrUnknownCodec},
		{"brotli", None, ErrUnknownCodec},
		{"lz4 frame", None, ErrUnknownCodec},
		{"producer", None, ErrUnknownCodec}, // a valid topic compression.type, not a codec
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCodec(tt.name)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestCodecFromID(t *testing.T) {
	for id := range 5 {
		c, err := CodecFromID(id)
		require.NoError(t, err)
		assert.Equal(t, id, int(c))
		assert.True(t, c.Valid())
	}
	for _, id := range []int{-1, 5, 6, 7, 128} {
		_, err := CodecFromID(id)
		require.ErrorIs(t, err, ErrUnknownCodec, "id %d", id)
		assert.False(t, Codec(int8(id)).Valid(), "id %d", id)
	}
	// The codec of a batch's attributes: LogAppendTime and transactional bits
	// set around lz4.
	c, err := CodecFromID(int(int16(0x0018|3) & AttributesMask))
	require.NoError(t, err)
	assert.Equal(t, LZ4, c)
}

func TestCodecText(t *testing.T) {
	type config struct{ Codec Codec }
	for c := None; c <= Zstd; c++ {
		b, err := json.Marshal(config{c})
		require.NoError(t, err)
		assert.JSONEq(t, `{"Codec":"`+c.String()+`"}`, string(b))
		var got config
		require.NoError(t, json.Unmarshal(b, &got))
		assert.Equal(t, c, got.Codec)
	}
	_, err := Codec(9).MarshalText()
	require.ErrorIs(t, err, ErrUnknownCodec)
	var c Codec
	require.ErrorIs(t, c.UnmarshalText([]byte("lzma")), ErrUnknownCodec)
}

func TestCheckLevel(t *testing.T) {
	tests := []struct {
		c       Codec
		level   int
		wantErr error
	}{
		{None, 0, nil},
		{None, 1, ErrInvalidLevel},
		{Snappy, 0, nil},
		{Snappy, 1, ErrInvalidLevel},
		{Snappy, -1, ErrInvalidLevel},
		{Gzip, -1, nil},
		{Gzip, 0, nil},
		{Gzip, 1, nil},
		{Gzip, 9, nil},
		{Gzip, 10, ErrInvalidLevel},
		{Gzip, -2, ErrInvalidLevel},
		{LZ4, 0, nil},
		{LZ4, 1, nil},
		{LZ4, 9, nil},
		{LZ4, 17, nil},
		{LZ4, 18, ErrInvalidLevel},
		{LZ4, -1, ErrInvalidLevel},
		{Zstd, -131072, nil},
		{Zstd, -131073, ErrInvalidLevel},
		{Zstd, 0, nil},
		{Zstd, 22, nil},
		{Zstd, 23, ErrInvalidLevel},
		{Codec(5), 0, ErrUnknownCodec},
	}
	for _, tt := range tests {
		err := tt.c.CheckLevel(tt.level)
		if tt.wantErr == nil {
			assert.NoError(t, err, "%s level %d", tt.c, tt.level)
		} else {
			assert.ErrorIs(t, err, tt.wantErr, "%s level %d", tt.c, tt.level)
		}
	}
}
