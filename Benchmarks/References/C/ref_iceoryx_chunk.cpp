// ref_iceoryx_chunk.cpp: the one thing ref-iceoryx needs that iceoryx 2.0's C binding does not
// offer: the user-payload size of a received chunk (the C binding's chunk.h has no getter for
// it). It comes from iceoryx's own public C++ API (iceoryx_posh/mepoo/chunk_header.hpp), so
// that an echo's or a one-way message's length is checked as the other references check theirs.
#include "iceoryx_posh/mepoo/chunk_header.hpp"

#include <cstdint>

extern "C" uint32_t ref_iox_user_payload_size(const void* userPayload)
{
    return iox::mepoo::ChunkHeader::fromUserPayload(userPayload)->userPayloadSize();
}
