// Radix sections (frame.h "Radix section") of float32 segments straight into a row sweep
// (row_sweep.h): each digit split off a value becomes its element through a table of the K
// codes' elements, in registers. The general decoder (radix.h's radix_unpack_to and a
// dequantizing sink) stores every lane of digits and reads it back to dequantize it, each
// element a double multiply and two conversions.
#pragma once

#include <stdint.h>

#include "frame_io.h"
#include "row_sweep.h"

namespace hl {

// Whether radix_sweep_f32 takes a segment's code section (else the general decoder does):
// float32, not dithered (dither offsets differ element by element), K small enough for the
// table to live in registers.
bool radix_sweep_applies(const SegmentView& h);

// Decodes the segment's radix section (radix_sweep_applies) into sweep: the codes of its
// n_unique * row_len elements, in order. step: the quantizer's step. FrameError as
// radix_unpack_to's, for a value >= K^g or a nonzero padding digit.
void radix_sweep_f32(const SegmentView& h, double step, RowSweep<uint32_t>* sweep);

}  // namespace hl
