// The Linux headers the Swift floor (round-trip-instructions' SwiftFloor.swift) needs and
// Glibc's Swift module does not export: epoll and eventfd.
#pragma once
#include <sys/epoll.h>
#include <sys/eventfd.h>
