#include "common/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace tandem::metrics {
namespace {

// Fields of /proc/self/stat that the metrics need (proc(5): utime 14, stime 15, starttime 22,
// vsize 23, rss 24; counted from 1).
struct ProcStat {
  double utime_ticks = 0;
  double stime_ticks = 0;
  double start_ticks = 0;
  double vsize_bytes = 0;
  double rss_pages = 0;
};

bool ReadProcStat(ProcStat& s) {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  // The command name (field 2) is in parentheses and may hold spaces: parse after the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 24 && rest >> field; ++i) {
    if (i == 14) s.utime_ticks = std::stod(field);
    if (i == 15) s.stime_ticks = std::stod(field);
    if (i == 22) s.start_ticks = std::stod(field);
    if (i == 23) s.vsize_bytes = std::stod(field);
    if (i == 24) {
      s.rss_pages = std::stod(field);
      return true;
    }
  }
  return false;
}

// Seconds since the epoch at which the machine booted (`btime` of /proc/stat), 0 if unknown.
double BootTime() {
  std::ifstream in("/proc/stat");
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime" && in >> value) return value;
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

int OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the directory stream's own descriptor
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                const std::string& role, double value) {
  prometheus::ClientMetric m;
  m.label.push_back({"role", role});
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return {name, help, type, {m}};
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  ProcStat s;
  if (!ReadProcStat(s)) return {};
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  out.push_back(Family("process_cpu_seconds_total", "User and system CPU time spent, seconds",
                       MetricType::Counter, role_, (s.utime_ticks + s.stime_ticks) / ticks));
  out.push_back(Family("process_resident_memory_bytes", "Resident memory size, bytes",
                       MetricType::Gauge, role_, s.rss_pages * page));
  out.push_back(Family("process_virtual_memory_bytes", "Virtual memory size, bytes",
                       MetricType::Gauge, role_, s.vsize_bytes));
  const double boot = BootTime();
  if (boot > 0) {
    out.push_back(Family("process_start_time_seconds",
                         "Start time of the process since the Unix epoch, seconds",
                         MetricType::Gauge, role_, boot + s.start_ticks / ticks));
  }
  if (const int fds = OpenFds(); fds >= 0) {
    out.push_back(
        Family("process_open_fds", "Open file descriptors", MetricType::Gauge, role_, fds));
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    out.push_back(Family("process_max_fds", "Limit on open file descriptors", MetricType::Gauge,
                         role_, static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

}  // namespace tandem::metrics
