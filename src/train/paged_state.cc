// PagedStatePool: file-backed optimizer state with a resident cap (see paged_state.h).
#include "train/paged_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/check.h"

namespace lathe::train {

Result<std::unique_ptr<PagedStatePool>> PagedStatePool::Create(const std::string& dir, size_t cap_bytes) {
  std::unique_ptr<PagedStatePool> p(new PagedStatePool());
  p->cap_ = cap_bytes;
  p->page_ = (size_t)sysconf(_SC_PAGESIZE);
  std::string tmpl = (dir.empty() ? std::string("/tmp") : dir) + "/lathe-optim-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  p->fd_ = mkstemp(buf.data());
  if (p->fd_ < 0) {
    return Status::Error("paged optimizer: cannot create a state file in '" + dir +
                         "': " + std::strerror(errno));
  }
  p->path_ = buf.data();
  unlink(p->path_.c_str());  // the open descriptor keeps it alive; nothing is left after exit
  return p;
}

PagedStatePool::~PagedStatePool() {
  if (base_) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
}

Status PagedStatePool::Map(size_t bytes) {
  LATHE_CHECK(base_ == nullptr);
  size_ = (std::max<size_t>(bytes, 1) + page_ - 1) / page_ * page_;
  if (ftruncate(fd_, (off_t)size_) != 0) {
    return Status::Error("paged optimizer: cannot size the state file " + path_ + " to " +
                         std::to_string(size_) + " bytes: " + std::strerror(errno));
  }
  void* m = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) {
    return Status::Error("paged optimizer: mmap of " + std::to_string(size_) + " bytes of " + path_ +
                         " failed: " + std::strerror(errno));
  }
  base_ = (uint8_t*)m;
  return Status::Ok();
}

void* PagedStatePool::Carve(size_t bytes) {
  LATHE_CHECK(base_ != nullptr);
  carved_ = (carved_ + 63) / 64 * 64;
  LATHE_CHECK(carved_ + bytes <= size_);
  void* p = base_ + carved_;
  carved_ += bytes;
  return p;
}

void PagedStatePool::PageOut(uint8_t* p, size_t len) {
  // Whole pages only: a partial page at either end may be shared with a neighbour still in use.
  uintptr_t b = ((uintptr_t)p + page_ - 1) / page_ * page_;
  uintptr_t e = ((uintptr_t)p + len) / page_ * page_;
  if (e <= b) return;
  msync((void*)b, e - b, MS_SYNC);
  madvise((void*)b, e - b, MADV_DONTNEED);
  posix_fadvise(fd_, (off_t)(b - (uintptr_t)base_), (off_t)(e - b), POSIX_FADV_DONTNEED);
}

void PagedStatePool::Used(void* p, size_t len) {
  if (cap_ == 0) return;  // no cap: nothing is ever paged out, so nothing to remember
  used_.push_back({(uint8_t*)p, len});
  tracked_ += len;
  while (tracked_ > cap_ && used_.size() > 1) {
    Region r = used_.front();
    used_.pop_front();
    tracked_ -= r.len;
    PageOut(r.p, r.len);
  }
  peak_tracked_ = std::max(peak_tracked_, tracked_);
}

void PagedStatePool::PageOutAll() {
  if (base_) PageOut(base_, size_);
  used_.clear();
  tracked_ = 0;
}

size_t PagedStatePool::ResidentBytes() const {
  if (!base_) return 0;
  // The smaps entry whose range starts at base_ (the whole mapping: nothing splits it), then its
  // "Rss:   N kB" line.
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  char line[512];
  bool ours = false;
  size_t kb = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) {
      ours = lo == (unsigned long)(uintptr_t)base_;
      continue;
    }
    if (ours && std::sscanf(line, "Rss: %zu kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb * 1024;
}

}  // namespace lathe::train
