// DGC's wire form: one rank's selected (index, value) pairs of one step, in about 4 bytes a
// pair instead of 8. Its size follows from the layout alone (every rank knows every
// tensor's size and this step's pair count), so one fixed-size all-gather carries all
// ranks' and nothing on the wire says how long anything is.
//
//   [one int8 exponent e per tensor]
//   [every pair's value: fp16, little-endian, tensor by tensor; the value is fp16 x 2^e]
//   [every pair's index within its tensor, bit-packed at ceil(log2 n) bits for a tensor of
//    n elements (1 bit at least), strictly increasing within a tensor, low bits first;
//    the last byte's unused bits are 0]
//
// Per-tensor power-of-two scaling keeps fp16 clear of overflow and underflow whatever the
// gradients' magnitude (the largest value of a tensor is scaled into [2^14, 2^15)), and
// scaling by 2^e is exact, so every rank decodes the same bits.
// The sender learns what its values became (Encode rounds them in place) and keeps the
// rounding error in its residual: nothing is lost, only delayed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shoal {

struct SparseLayout {
  std::vector<int64_t> sizes;   // elements of each compressed tensor, in order
  std::vector<int64_t> counts;  // pairs this step per tensor (<= its size)
};

// Bytes of one rank's encoding under `layout`.
int64_t SparseEncodedBytes(const SparseLayout& layout);

// Encodes counts[t] pairs per tensor, given tensor by tensor in idx/val: idx relative to
// the tensor, strictly increasing within it; val finite. Rounds each val in place to the
// value the receivers will decode. Throws shoal::Error on input that breaks these rules.
std::vector<uint8_t> SparseEncode(const SparseLayout& layout, const std::vector<int32_t>& idx, std::vector<float>* val);

// Checks one rank's encoding (`bytes` bytes at `data`) and adds its values into `out`, the
// concatenation of the layout's tensors (decoded index i of tensor t lands at t's offset +
// i). An encoding of the wrong size, an index outside its tensor or out of order, a value
// that decodes to inf or NaN, an exponent the encoder would not pick for the values (so an
// accepted encoding is exactly what the encoder writes for its pairs) or non-zero padding is
// refused
// with shoal::Error naming `who` and what is wrong, before anything is added.
void SparseDecodeAdd(const SparseLayout& layout, const uint8_t* data, int64_t bytes, float* out,
                     const std::string& who);

// The same checks, returning the pairs (tensor-relative indices, decoded values).
void SparseDecode(const SparseLayout& layout, const uint8_t* data, int64_t bytes, std::vector<int32_t>* idx,
                  std::vector<float>* val, const std::string& who);

}  // namespace shoal
