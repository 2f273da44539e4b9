// The CPU codec's hot loops, built for several instruction sets (GCC/Clang target_clones pick
// AVX2 at load time where the CPU has it; range passes, dequantizers and the 16-bit quantizer
// also have AVX-512 versions) so that one binary is portable and fast.
#pragma once

#include <math.h>
#include <stdint.h>

// Loops left to the compiler's vectorizer, built for AVX2 and for the baseline, the clone picked
// at load: the simple loops beside the hand-written kernels, in every file that has them.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HL_NO_CLONES)
#define HL_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HL_AVX2_CLONES
#endif

namespace hl {
namespace cpu {

// Instruction set the kernels use, decided once at load: 0 portable loops, 1 AVX2 (with FMA,
// which every AVX2 CPU has), 2 AVX-512
// (F, VL, DQ, BW, with F16C; the float16/bfloat16 kernels exist only at this level).
// HVD_LOSSY_NO_AVX2=1 in the environment forces 0, HVD_LOSSY_NO_AVX512=1 at most 1; the tests
// compare the frames of all three.
int simd_level();

// The variables that force a slower kernel path: kForcing[0] keeps the portable loops,
// kForcing[1] AVX2 at most. simd_forced() has bit k set where kForcing[k] was set to force
// (anything but "" or "0") when simd_level() read them, once: what a benchmark records.
constexpr const char* kForcing[2] = {"HVD_LOSSY_NO_AVX2", "HVD_LOSSY_NO_AVX512"};
int simd_forced();

struct QuantParams {
  double step, inv_step, eb_abs;
  bool dither = false;    // subtractive dither: element k of the call has offset index first + k
  uint32_t seed = 0;
  uint64_t first = 0;
  // Every finite element's |x| is at most this (the segment's range, where it was taken): lets
  // the float32 kernels skip a check (quantize_f32_fast.h). Changes no code.
  double max_abs = INFINITY;
};

// The parameters of a lossy segment of absolute bound eb_abs (> 0), from element 0 on.
inline QuantParams quant_params(double eb_abs, bool dither = false, uint32_t seed = 0) {
  QuantParams qp;
  qp.step = 2.0 * eb_abs;
  qp.inv_step = 1.0 / qp.step;
  qp.eb_abs = eb_abs;
  qp.dither = dither;
  qp.seed = seed;
  return qp;
}

// Smallest and largest finite value of n elements (lo > hi when none is finite).
void finite_range(uint8_t dtype, const void* x, uint64_t n, double* lo, double* hi);

// Quantizes `rows` rows of row_len elements: zigzag codes or kOutlierMark into z, per-row
// outlier flags, and (when hashes is not null) a hash of each row's codes for dedup. Output row
// r comes from input row idx[r] (or r when idx is null).
void quantize_rows(uint8_t dtype, const void* x, const uint64_t* idx, uint64_t rows,
                   uint64_t row_len, const QuantParams& qp, uint32_t* z, uint8_t* row_outlier,
                   uint64_t* hashes);

// quantize_rows that also gives each row's codes as bytes where they fit: narrow[r] = 1 when
// every code of row r is below 256 (so no outlier's mark), its codes then also in bytes +
// r * row_len (other rows' bytes hold nothing of use), and z holds the codes of every row that is
// not narrow (a narrow row's z may hold nothing of use). With hashes: for narrow rows a hash of the
// bytes, for the others of the codes and outliers' bits, bit 32 set (the dedup table's tag). With
// idx the rows are gathered (never dithered: dither turns dedup off).
void quantize_rows_narrow(uint8_t dtype, const void* x, const uint64_t* idx, uint64_t rows,
                          uint64_t row_len, const QuantParams& qp, uint32_t* z,
                          uint8_t* row_outlier, uint64_t* hashes, uint8_t* narrow,
                          uint8_t* bytes);

// Raw bits of the elements as codes (lossless frames), rows chosen as above.
void raw_rows(uint8_t dtype, const void* x, const uint64_t* idx, uint64_t rows, uint64_t row_len,
              uint32_t* z);

// A hash of each row's raw bytes (row_bytes each), to find rows repeated bit for bit.
void hash_raw_rows(const uint8_t* x, uint64_t rows, uint64_t row_bytes, uint64_t* hashes);

// Decoder: n codes to elements of dtype (hl::reconstruct of each unzigzagged code).
void dequantize(uint8_t dtype, const uint32_t* z, uint64_t n, double step, void* out);

// Decoder of dithered frames: code k is element first + k of the frame (hl::reconstruct with its offset).
void dequantize_dithered(uint8_t dtype, const uint32_t* z, uint64_t n, double step, uint32_t seed,
                         uint64_t first, void* out);

// What coded_row_f32 made of a row: nothing of use (the general path must take it), or X^
// within the bound of every element of X, or some element of X^ outside it.
constexpr int kRowUnsure = 0, kRowWithin = 1, kRowMiss = 2;

// A float32 row of reuse's sweep in one pass (native/cpu/reuse.cc), against its held row P or,
// with p null, fresh: R = X - P (or X) into r, R's codes at qp (no dither) and their
// reconstruction R^, X^ = P + R^ (or R^) into xh, and for a held row every element of X^
// checked against X within eb with check_row's answer (in single precision where that cannot
// differ from the double test, else in double); *same: X^ equals P in value,
// *as_held: in bits. It answers only where every code is one that single precision decides for
// sure (quantize_f32_fast.h), so never an outlier, and reconstructs exactly there
// (f32_exact_codes): every bit it writes is then the general path's (quantize_rows, dequantize,
// the sum and the check). Otherwise, for row lengths that are not a multiple of 8, and without
// AVX2, kRowUnsure, having written nothing of use.
int coded_row_f32(const float* x, const float* p, uint64_t d, const QuantParams& qp, double eb,
                  float* r, float* xh, bool* same, bool* as_held);

// Outputs of this many bytes or more are written with non-temporal (streaming) stores, which
// save reading each line before it is written. An all-to-all decodes into a block the output
// cache hands out while the previous call's output is still alive, and the model's work runs
// between calls: the lines are cold, far from the caches that a benchmark decoding into one
// reused tensor keeps them in (benchmarks/RESULTS.md, "Cold outputs").
constexpr uint64_t kStreamFrom = uint64_t(1) << 20;

// memcpy with streaming stores where the CPU has AVX2 (memcpy otherwise), fenced: what it wrote
// is visible to any later read.
void stream_copy(uint8_t* dst, const uint8_t* src, uint64_t bytes);

// Copies bytes of output (dst and src do not overlap) as a decode writes them: stream_copy from
// kStreamFrom bytes on, memcpy below. An all-to-all's own rows into its output.
void copy_output(uint8_t* dst, const uint8_t* src, uint64_t bytes);

// Row r of out (rows rows of row_bytes) is row map[r] of uniq: the decoder's expansion of
// duplicate rows. The source rows are prefetched a few rows ahead (they are random reads);
// stream: write with streaming stores where the rows allow it (see kStreamFrom).
void expand_rows(uint8_t* out, const uint8_t* uniq, const uint32_t* map, uint64_t rows,
                 uint64_t row_bytes, bool stream);

}  // namespace cpu
}  // namespace hl
