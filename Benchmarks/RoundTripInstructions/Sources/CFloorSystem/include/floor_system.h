// The Linux headers the Swift floor (round-trip-instructions' SwiftFloor.swift) needs and
// Glibc's Swift module does not export: epoll and eventfd; and the spin-wait hint.
#pragma once
#include <sys/epoll.h>
#include <sys/eventfd.h>

/// The CPU's spin-wait hint (`pause`), between two polls of a spinning floor.
static inline void floor_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
