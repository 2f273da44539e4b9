// CRC32C (Castagnoli, reflected polynomial 0x82f63b78, init and final xor ~0): the checksum of
// format-2 frames. crc32c() uses SSE4.2's crc32 instruction when the CPU has it and a table
// otherwise; both give the same value (crc32c_portable is the reference).
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace hl {

uint32_t crc32c(const uint8_t* p, uint64_t n);
uint32_t crc32c_portable(const uint8_t* p, uint64_t n);
// crc32c() computed as the CUDA codec does (frame_fields.h): the CRC of every `piece` bytes
// from a zero register, each shifted past the bytes after it, XORed in reverse order. For tests.
uint32_t crc32c_in_pieces(const uint8_t* p, uint64_t n, uint64_t piece);
// Whether crc32c() runs on the hardware instruction.
bool crc32c_hardware();

}  // namespace hl
