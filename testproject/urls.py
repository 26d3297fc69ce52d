from django.contrib import admin
from django.urls import path

from django_pgqueue import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics/pgqueue", metrics.view),
]
