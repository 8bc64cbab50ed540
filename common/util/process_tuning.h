// Process-wide settings for Tandem's long-running processes, applied once at startup.
#pragma once

namespace tandem {

// - Keeps freed heap memory for reuse instead of returning it to the kernel. Workers and store
//   shards allocate and free KV block buffers of 64 KiB to several MiB all the time; by default
//   glibc serves those from fresh mmaps or trims them back, so every handoff pays page faults
//   on memory it just gave away (a third of a shared-memory get's time on a 2-core VM).
// - Turns off absl::Mutex deadlock detection: Debian's absl is built with it on and records a
//   lock graph with stack traces on every contended lock (~4% of the router's CPU per token).
//   Tests keep it on.
void TuneServingProcess();

}  // namespace tandem
